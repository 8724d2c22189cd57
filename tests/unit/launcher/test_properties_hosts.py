"""Property-based tests (Hypothesis) for every host and environment parser of ``hvdkit run``.

Each property either reads back what a writer of that format produces (-H lists, Open MPI and
horovodrun hostfiles, SLURM's compressed node lists and task counts, the MPI Operator's hostfile,
``-x NAME=VALUE``), or feeds arbitrary text and accepts only a valid result or a ConfigError.
Examples are derandomized (the same cases on every run) and few: the whole file takes seconds.
"""

import os
import tempfile

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from hvdkit.core import ConfigError
from hvdkit.launcher import hosts
from hvdkit.launcher.hosts import Host
from hvdkit.launcher.plan import build
from hvdkit.launcher.spec import JobSpec, parse_env_vars

FAST = settings(max_examples=40, deadline=None, derandomize=True, database=None)
GARBAGE = settings(max_examples=100, deadline=None, derandomize=True, database=None)

NAME = st.from_regex(r"[A-Za-z0-9][A-Za-z0-9._@-]{0,15}", fullmatch=True)
SLOTS = st.integers(1, 64)
HOSTS = st.lists(st.tuples(NAME, SLOTS), min_size=1, max_size=6, unique_by=lambda h: h[0]).map(
    lambda pairs: tuple(Host(n, s) for n, s in pairs)
)
# Text that mixes the characters the formats give meaning to with anything else (no surrogates).
SPECIAL = st.sampled_from(list(",:=# \t\n\r[]()x-0123456789") + ["slots=", "max_slots=", "\u2028", "\x85", "\x00"])
ONE_CHAR = st.one_of(SPECIAL, st.characters(exclude_categories=("Cs",)))
TROUBLE = st.sampled_from(["\n", "\r", "\t", " ", ":", ",", "#", "=", "[", "\u2028", "\x00", "\x0b"])


@st.composite
def near_valid(draw, separator=","):
    """Valid-looking host text (``name:N`` or ``name slots=N`` entries) with a few characters put in anywhere."""
    entries = []
    for name, slots in draw(st.lists(st.tuples(NAME, SLOTS), min_size=1, max_size=4)):
        entries.append(draw(st.sampled_from([f"{name}:{slots}", name, f"{name} slots={slots}"])))
    text = separator.join(entries)
    for _ in range(draw(st.integers(0, 3))):
        at = draw(st.integers(0, len(text)))
        text = text[:at] + draw(st.one_of(TROUBLE, ONE_CHAR)) + text[at:]
    return text


ANY_TEXT = st.one_of(
    near_valid(), near_valid("\n"), st.lists(st.one_of(NAME, ONE_CHAR, ONE_CHAR), max_size=12).map("".join)
)


def _well_formed(found):
    """Every host a parser returns could be written back as -H: a name of the allowed characters, slots >= 1."""
    assert isinstance(found, tuple)
    for host in found:
        assert isinstance(host, Host) and host.slots >= 1
        assert host.name.isascii() and host.name.isprintable() and " " not in host.name
    assert len({h.name for h in found}) == len(found)


def _accepts_or_config_error(parse, text):
    try:
        found = parse(text)
    except ConfigError as e:
        assert str(e)  # a message, naming the value
        return None
    return found


@FAST
@given(HOSTS, st.data())
def test_a_host_list_reads_back_as_the_hosts_it_was_written_from(found, data):
    entries = []
    for host in found:
        entry = str(host) if host.slots != 1 or data.draw(st.booleans()) else host.name  # ":1" may be left out
        pad = data.draw(st.sampled_from(["", " ", "  ", "\t"]))
        entries.append(pad + entry + pad)
    assert hosts.parse_host_list(",".join(entries)) == found
    assert hosts.parse_host_list(hosts.format_hosts(found)) == found


@GARBAGE
@given(ANY_TEXT)
@example("node1\n:2")  # once accepted: `$` matched before the newline
@example("a:" + "1" * 5000)  # once a bare ValueError from int()
def test_any_host_list_text_gives_valid_hosts_or_a_config_error(text):
    found = _accepts_or_config_error(hosts.parse_host_list, text)
    if found is not None:
        _well_formed(found)
        assert hosts.parse_host_list(hosts.format_hosts(found)) == found


@FAST
@given(HOSTS, st.data())
def test_a_hostfile_in_either_syntax_reads_back_as_its_hosts(found, data):
    lines = []
    for host in found:
        if data.draw(st.booleans()):
            lines.append(data.draw(st.sampled_from(["# a comment", "", "   ", "#node9 slots=3"])))
        form = data.draw(st.sampled_from(["openmpi", "horovodrun", "max_slots"]))
        if form == "openmpi":
            line = f"{host.name} slots={host.slots}" if host.slots != 1 or data.draw(st.booleans()) else host.name
        elif form == "horovodrun":
            line = str(host)
        else:
            line = f"{host.name}\tslots={host.slots} max_slots={host.slots + 3}"
        comment = data.draw(st.sampled_from(["", "  # rack 2", "#x"]))
        lines.append(data.draw(st.sampled_from(["", "  "])) + line + comment)
    ending = data.draw(st.sampled_from(["\n", "\r\n"]))
    assert hosts.parse_hostfile(ending.join(lines) + ending) == found


@GARBAGE
@given(ANY_TEXT)
@example("node1 slots=" + "1" * 5000)
def test_any_hostfile_text_gives_valid_hosts_or_a_config_error(text):
    found = _accepts_or_config_error(hosts.parse_hostfile, text)
    if found is not None:
        _well_formed(found)
        assert found  # a hostfile that lists nobody is an error, never ()


def _compress(prefix, numbers, width):
    """SLURM's form of ``prefix`` + each number zero-padded to ``width``: ``n[01-03,07]``."""
    runs, start = [], None
    for i, n in enumerate(numbers):
        if start is None:
            start = n
        if i + 1 == len(numbers) or numbers[i + 1] != n + 1:
            runs.append(f"{start:0{width}d}" if start == n else f"{start:0{width}d}-{n:0{width}d}")
            start = None
    return f"{prefix}[{','.join(runs)}]" if len(numbers) > 1 or width > 1 else f"{prefix}{numbers[0]}"


SLURM_GROUP = st.tuples(
    st.from_regex(r"[a-z][a-z0-9-]{0,6}[a-z-]", fullmatch=True),  # ends in a letter: digits start the range
    st.lists(st.integers(0, 300), min_size=1, max_size=8, unique=True).map(sorted),
    st.integers(1, 4),
)


@FAST
@given(st.lists(SLURM_GROUP, min_size=1, max_size=4, unique_by=lambda g: g[0]))
def test_a_compressed_slurm_node_list_expands_to_every_node_in_order(groups):
    text = ",".join(_compress(prefix, numbers, width) for prefix, numbers, width in groups)
    expected = tuple(f"{prefix}{n:0{width}d}" for prefix, numbers, width in groups for n in numbers)
    assert hosts.expand_nodelist(text) == expected


@FAST
@given(st.lists(st.tuples(st.integers(1, 16), st.integers(1, 5)), min_size=1, max_size=6))
def test_slurm_tasks_per_node_expand_their_repeat_counts(runs):
    text = ",".join(f"{count}(x{repeat})" if repeat > 1 else str(count) for count, repeat in runs)
    assert hosts.expand_tasks_per_node(text) == tuple(c for count, repeat in runs for c in [count] * repeat)


@GARBAGE
@given(ANY_TEXT, ANY_TEXT)
@example("n[1-100000000000]", "1")  # once a list of 10^11 names
@example("n1", "1(x100000000000)")
def test_any_slurm_variables_give_valid_hosts_or_a_config_error(nodelist, tasks):
    environ = {"SLURM_JOB_NODELIST": nodelist, "SLURM_TASKS_PER_NODE": tasks}
    found = _accepts_or_config_error(hosts.slurm_hosts, environ)
    if found is not None:
        _well_formed(found)
    for parse in (hosts.expand_nodelist, hosts.expand_tasks_per_node):
        _accepts_or_config_error(parse, nodelist)


K8S_NAME = st.from_regex(r"[a-z0-9]([-a-z0-9]{0,20}[a-z0-9])?", fullmatch=True)


@settings(FAST, suppress_health_check=[HealthCheck.too_slow])
@given(K8S_NAME, K8S_NAME, st.integers(1, 12), st.integers(1, 8), st.sampled_from(["{j}", "{j}-worker", "{j}-worker."]))
def test_the_mpi_operator_hostfile_gives_every_worker_with_its_slots(job, namespace, workers, slots, service):
    # As operator versions write it: JOB-worker-I.SERVICE.NAMESPACE.svc slots=S (SERVICE: JOB or
    # JOB-worker), or JOB-worker-I.JOB-worker slots=S (written here as the service "JOB-worker.").
    service = service.format(j=job)
    domain = "" if service.endswith(".") else f".{namespace}.svc"
    names = [f"{job}-worker-{i}.{service.rstrip('.')}{domain}" for i in range(workers)]
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "hostfile")
        with open(path, "w") as f:
            f.write("".join(f"{n} slots={slots}\n" for n in names))
        found, origin = hosts.resolve(environ={hosts.MPI_OPERATOR_HOSTFILE_VAR: path})
    assert found == tuple(Host(n, slots) for n in names)
    assert path in origin


ENV_NAME = st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,12}", fullmatch=True)
ENV_VALUE = st.text(st.characters(exclude_categories=("Cs",), exclude_characters="\x00"), max_size=30)


@FAST
@given(st.dictionaries(ENV_NAME, ENV_VALUE, max_size=5), st.dictionaries(ENV_NAME, ENV_VALUE, max_size=3))
def test_env_values_reach_every_rank_exactly_as_given(given_env, shell):
    # -x NAME=VALUE takes VALUE as it is (any text, '=' and newlines included); -x NAME takes the shell's.
    items = [f"{k}={v}" for k, v in given_env.items()] + [k for k in shell if k not in given_env]
    expected = {**given_env, **{k: v for k, v in shell.items() if k not in given_env}}
    env = parse_env_vars(items, shell)
    assert env == expected
    plan = build(JobSpec(("python", "t.py"), 2, env=env), is_root=False, cores=2, python="python", base_env={})
    assert {k: plan.env[k] for k in env} == env  # mpirun -x NAME passes the launcher's value on
    exported = {plan.argv[i + 1] for i, a in enumerate(plan.argv) if a == "-x"}
    assert set(env) <= exported


@GARBAGE
@given(ANY_TEXT)
def test_any_env_item_is_a_variable_or_a_config_error(item):
    env = _accepts_or_config_error(lambda text: parse_env_vars([text], {}), item)
    if env is not None:
        ((name, value),) = env.items()
        assert item == f"{name}={value}" and name.isidentifier() and name.isascii()


def test_the_property_strategies_produce_what_the_formats_allow():
    # The writers above must themselves be right, or a property proves nothing.
    assert _compress("n", [1, 2, 3, 7], 2) == "n[01-03,07]"
    assert _compress("gpu", [5], 1) == "gpu5"
    with pytest.raises(ConfigError):
        hosts.parse_host_list("a:1,a:2")

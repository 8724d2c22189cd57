"""Property-based tests (Hypothesis): every rendered file parses back to the job it was rendered from.

For random jobs whose command words hold quotes, ``$``, backticks, ``#``, newlines, tabs, line
separators and any other text: the SLURM script passes ``bash -n`` and, run by bash with a recorder in
place of ``hvdkit``, starts exactly that command; its ``#SBATCH`` lines are all there, before the
first command; the MPIJob loads with ``yaml.safe_load`` to exactly the expected job (no key gained);
the mpirun/horovodrun scripts start exactly the plan's argv (and ``shlex.split`` of the last line
gives it when the words are printable); the hostfile reads back as the hosts; and the header's
``hvdkit render`` line renders the same file again.
Examples are derandomized and few (each one runs bash a few times).
"""

import shlex
import tempfile

import yaml
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from rendered_scripts import argv_the_script_runs, bash_syntax_ok

from hvdkit import cli
from hvdkit.launcher.hosts import Host, parse_hostfile
from hvdkit.launcher.plan import build
from hvdkit.launcher.render import files as render
from hvdkit.launcher.render.files import SCRIPT_ENV, RenderSpec
from hvdkit.launcher.spec import JobSpec

FAST = settings(
    max_examples=30, deadline=None, derandomize=True, database=None, suppress_health_check=[HealthCheck.too_slow]
)

TRICKY = st.sampled_from(
    [
        "\n",
        "\r",
        "\t",
        "'",
        '"',
        "$",
        "`",
        "\\",
        "#",
        "!",
        " ",
        ": ",
        "- ",
        "{",
        "}",
        "*",
        "~",
        "\u2028",
        "\x85",
        "é",
        "\x1b",
    ]
)
WORD = st.lists(
    st.one_of(TRICKY, st.characters(exclude_categories=("Cs",), exclude_characters="\x00")), min_size=1, max_size=8
).map("".join)
COMMAND = st.lists(WORD, min_size=0, max_size=4).map(lambda words: ("python", *words))
K8S_NAME = st.from_regex(r"[a-z0-9]([-a-z0-9]{0,20}[a-z0-9])?", fullmatch=True)
HOST_NAME = st.from_regex(r"[A-Za-z0-9][A-Za-z0-9._@-]{0,10}", fullmatch=True)


@st.composite
def jobs(draw):
    """A valid RenderSpec: a tricky command, counts that fit, sometimes named hosts."""
    command = draw(COMMAND)
    if draw(st.booleans()):
        names = draw(st.lists(HOST_NAME, min_size=1, max_size=3, unique=True))
        hosts = tuple(Host(n, draw(st.integers(1, 4))) for n in names)
        nodes, slots = len(hosts), max(h.slots for h in hosts)
        num_proc = draw(st.integers(1, sum(h.slots for h in hosts)))
    else:
        hosts, nodes, slots = (), draw(st.integers(1, 4)), draw(st.integers(1, 4))
        num_proc = draw(st.integers(1, nodes * slots))
    return RenderSpec(
        command=command,
        num_proc=num_proc,
        nodes=nodes,
        slots_per_node=slots,
        name=draw(K8S_NAME),
        cpu=slots * draw(st.integers(1, 2)),
        memory=f"{draw(st.integers(1, 64))}{draw(st.sampled_from(['Mi', 'Gi', 'Ti']))}",
        image=draw(st.from_regex(r"[a-z0-9][a-z0-9./-]{0,12}:[a-z0-9.]{1,6}", fullmatch=True)),
        hosts=hosts,
    )


NEWLINE_JOB = RenderSpec(
    command=("python", "-c", "import os\n#SBATCH --nodes=99\nkind: Pod"), nodes=2, slots_per_node=2
)


def _commands(text):
    return [line for line in text.splitlines() if line.strip() and not line.startswith("#")]


@FAST
@given(jobs())
@example(NEWLINE_JOB)
def test_the_slurm_script_runs_exactly_the_job_with_every_sbatch_line(spec):
    text = render.render("slurm", spec)
    assert text.count("\n") == len(text.splitlines())  # no other line breaks (\r, \u2028, ...) than the "\n"s
    sbatch = [line for line in text.splitlines() if line.startswith("#SBATCH")]
    assert sbatch == [
        f"#SBATCH --job-name={spec.name}",
        f"#SBATCH --nodes={spec.nodes}",
        f"#SBATCH --ntasks={spec.num_proc}",
        f"#SBATCH --ntasks-per-node={spec.slots_per_node}",
        f"#SBATCH --cpus-per-task={spec.cpu // spec.slots_per_node}",
        f"#SBATCH --mem={spec.memory[:-2]}{spec.memory[-2]}",
    ]
    lines = text.splitlines()
    assert _commands(text) == ["set -euo pipefail", lines[-1]]  # sbatch reads #SBATCH up to the first
    assert lines.index("set -euo pipefail") > lines.index(sbatch[-1])
    with tempfile.TemporaryDirectory() as folder:
        assert bash_syntax_ok(text, folder)[0]
        code, argv, err = argv_the_script_runs(text, "hvdkit", folder, env={"SLURM_NTASKS": str(spec.num_proc)})
    assert (code, argv) == (0, ["run", "-np", str(spec.num_proc), "--", *spec.command]), err


def _leaves(tree, path=()):
    """``{path: value}`` of every leaf of nested dicts and lists (a list's items by their index)."""
    items = tree.items() if isinstance(tree, dict) else enumerate(tree) if isinstance(tree, list) else None
    if items is None:
        return {path: tree}
    return {leaf: value for key, child in items for leaf, value in _leaves(child, (*path, key)).items()}


def test_leaves_names_every_leaf_by_its_path():
    assert _leaves({"a": [1, {"b": None}], "c": {}}) == {("a", 0): 1, ("a", 1, "b"): None}


@FAST
@given(jobs())
@example(NEWLINE_JOB)
def test_the_mpijob_loads_as_exactly_the_job(spec):
    job = yaml.safe_load(render.render("mpijob", spec))
    launcher = ("spec", "mpiReplicaSpecs", "Launcher")
    worker = ("spec", "mpiReplicaSpecs", "Worker")
    in_launcher = (*launcher, "template", "spec", "containers", 0)
    in_worker = (*worker, "template", "spec", "containers", 0)
    launch = ["hvdkit", "run", "-np", str(spec.num_proc), "--", *spec.command]
    sshd = ["/usr/sbin/sshd", "-De", "-f", "/home/hvdkit/.sshd_config"]
    assert _leaves(job) == {
        ("apiVersion",): "kubeflow.org/v2beta1",
        ("kind",): "MPIJob",
        ("metadata", "name"): spec.name,
        ("spec", "slotsPerWorker"): spec.slots_per_node,
        ("spec", "runPolicy", "cleanPodPolicy"): "Running",
        ("spec", "sshAuthMountPath"): render.SSH_SECRET,
        ("spec", "mpiImplementation"): "OpenMPI",
        (*launcher, "replicas"): 1,
        (*in_launcher, "name"): "launcher",
        (*in_launcher, "image"): spec.image,
        **{(*in_launcher, "args", i): arg for i, arg in enumerate(launch)},
        (*worker, "replicas"): spec.nodes,
        (*in_worker, "name"): "worker",
        (*in_worker, "image"): spec.image,
        **{(*in_worker, "args", i): arg for i, arg in enumerate(sshd)},
        (*in_worker, "resources", "limits", "cpu"): str(spec.cpu),
        (*in_worker, "resources", "limits", "memory"): spec.memory,
    }


@FAST
@given(jobs(), st.sampled_from(["mpirun", "horovodrun"]))
@example(NEWLINE_JOB, "mpirun")
def test_the_launcher_scripts_run_exactly_the_plan(spec, tool):
    text = render.render(tool, spec)
    controller = "mpi" if tool == "mpirun" else "gloo"
    job = JobSpec(spec.command, spec.num_proc, controller=controller, hosts=spec.launch_hosts)
    plan = build(job, is_root=False, cores=spec.num_proc, python="python", base_env=SCRIPT_ENV, mpirun="mpirun")
    assert _commands(text) == ["set -euo pipefail", "export PYTHONUNBUFFERED=1", text.splitlines()[-1]]
    with tempfile.TemporaryDirectory() as folder:
        assert bash_syntax_ok(text, folder)[0]
        code, argv, err = argv_the_script_runs(text, tool, folder)
    assert (code, argv) == (0, list(plan.argv[1:])), err
    if all(word.isprintable() for word in spec.command):
        assert shlex.split(text.splitlines()[-1]) == ["exec", tool, *plan.argv[1:]]


@FAST
@given(jobs())
@example(NEWLINE_JOB)
def test_the_hostfile_reads_back_as_the_job_hosts(spec):
    assert parse_hostfile(render.render("hostfile", spec)) == spec.launch_hosts


@settings(FAST, max_examples=15)
@given(jobs(), st.sampled_from(render.TARGETS))
@example(NEWLINE_JOB, "slurm")
def test_the_header_render_line_renders_the_same_file_again(spec, target):
    text = render.render(target, spec)
    argv = render.render_command(target, spec)
    (line,) = [line[4:] for line in text.splitlines() if line.startswith("#   hvdkit render ")]
    with tempfile.TemporaryDirectory() as folder:
        code, parsed, err = argv_the_script_runs(line + "\n", "hvdkit", folder)  # bash reads the words back
        assert (code, parsed) == (0, argv[1:]), err
        out = f"{folder}/again"
        assert cli.main([*parsed[:2], "-o", out, *parsed[2:]]) == 0
        with open(out, encoding="utf-8") as f:
            assert f.read() == text

"""Host sources for `hvdkit run`: -H, hostfiles, SLURM, the MPI Operator, and the plans they give."""

import os
import shlex
import subprocess

import pytest
from helpers import BIN, HVDKIT, PYTHON, ROOT

from hvdkit.core import ConfigError
from hvdkit.launcher import hosts
from hvdkit.launcher.hosts import Host
from hvdkit.launcher.plan import build, find_tool, keeps_prefix
from hvdkit.launcher.spec import JobSpec

PY = "/venv/bin/python"
TWO_BY_TWO = (Host("node1", 2), Host("node2", 2))
NO_OPERATOR = "/nonexistent/hvdkit-test/hostfile"  # never the real /etc/mpi/hostfile of this machine
# Across hosts, an mpirun of a system folder (this machine's) gets --noprefix (test_launch_plan.py says why).
ACROSS_NOPREFIX = [] if keeps_prefix(find_tool("mpirun", PY), local=False) else ["--noprefix"]


def test_host_list_gives_each_host_its_slots_and_one_slot_by_default():
    assert hosts.parse_host_list("a:2,b,c.example.com:16") == (Host("a", 2), Host("b", 1), Host("c.example.com", 16))


def test_hostfile_reads_open_mpi_and_horovodrun_lines_with_comments_and_blank_lines():
    text = "# cluster\n\nnode1 slots=4  # big one\nnode2:2\n   \nnode3\nnode4 slots=2 max_slots=8\n"
    assert hosts.parse_hostfile(text) == (Host("node1", 4), Host("node2", 2), Host("node3", 1), Host("node4", 2))


@pytest.mark.parametrize(
    "nodelist, names",
    [
        ("node[01-03,07]", ("node01", "node02", "node03", "node07")),
        ("a,b", ("a", "b")),
        ("n[8-10]", ("n8", "n9", "n10")),
        ("gpu[1-2],cpu07", ("gpu1", "gpu2", "cpu07")),
        ("rack[1-2]-n[1-2]", ("rack1-n1", "rack1-n2", "rack2-n1", "rack2-n2")),
        ("single", ("single",)),
    ],
)
def test_slurm_node_lists_expand_ranges_keeping_zero_padding(nodelist, names):
    assert hosts.expand_nodelist(nodelist) == names


@pytest.mark.parametrize("text, counts", [("2(x3),1", (2, 2, 2, 1)), ("4", (4,)), ("1,3(x2)", (1, 3, 3))])
def test_slurm_tasks_per_node_expand_their_repeats(text, counts):
    assert hosts.expand_tasks_per_node(text) == counts


def test_a_slurm_allocation_pairs_each_node_with_its_task_count():
    environ = {"SLURM_JOB_NODELIST": "node[01-03,07]", "SLURM_TASKS_PER_NODE": "2(x3),1"}
    assert hosts.slurm_hosts(environ) == (Host("node01", 2), Host("node02", 2), Host("node03", 2), Host("node07", 1))


def test_slurm_nodes_get_one_slot_each_when_tasks_per_node_is_unset():
    assert hosts.slurm_hosts({"SLURM_NODELIST": "a,b"}) == (Host("a", 1), Host("b", 1))


def test_outside_slurm_there_are_no_slurm_hosts():
    assert hosts.slurm_hosts({"PATH": "/bin"}) == ()


def test_slurm_task_counts_that_do_not_match_the_nodes_are_an_error():
    environ = {"SLURM_JOB_NODELIST": "n[1-3]", "SLURM_TASKS_PER_NODE": "2(x2)"}
    with pytest.raises(ConfigError, match=r"gives 2 counts for the 3 nodes in SLURM_JOB_NODELIST='n\[1-3\]'"):
        hosts.slurm_hosts(environ)


def test_the_mpi_operator_hostfile_is_found_at_its_default_path(tmp_path):
    path = tmp_path / "hostfile"
    path.write_text("job-worker-0.job.default.svc slots=2\njob-worker-1.job.default.svc slots=2\n")
    assert hosts.mpi_operator_hostfile({}, default_path=str(path)) == str(path)
    assert hosts.mpi_operator_hostfile({}, default_path=str(tmp_path / "absent")) is None
    found, origin = hosts.resolve(environ={}, operator_hostfile=str(path))
    assert found == (Host("job-worker-0.job.default.svc", 2), Host("job-worker-1.job.default.svc", 2))
    assert origin == f"the MPI Operator hostfile {path}"


def test_the_mpi_operator_variable_names_the_hostfile(tmp_path):
    path = tmp_path / "elsewhere"
    path.write_text("w0 slots=3\n")
    environ = {"OMPI_MCA_orte_default_hostfile": str(path)}
    found = hosts.resolve(environ=environ, operator_hostfile=NO_OPERATOR)
    assert found == ((Host("w0", 3),), f"the MPI Operator hostfile {path}")


def test_an_mpi_operator_variable_naming_no_file_is_an_error(tmp_path):
    environ = {"OMPI_MCA_orte_default_hostfile": str(tmp_path / "gone")}
    with pytest.raises(ConfigError, match=r"OMPI_MCA_orte_default_hostfile='.*gone' names no file"):
        hosts.resolve(environ=environ, operator_hostfile=NO_OPERATOR)


@pytest.fixture
def every_source(tmp_path):
    """One host from each source, each with a different name, so the winner is visible."""
    hostfile = tmp_path / "hosts.txt"
    hostfile.write_text("from-hostfile slots=2\n")
    operator = tmp_path / "operator"
    operator.write_text("from-operator slots=2\n")
    slurm = {"SLURM_JOB_NODELIST": "from-slurm", "SLURM_TASKS_PER_NODE": "2"}
    return {"host_list": "from-h:2", "hostfile": str(hostfile), "operator": str(operator), "slurm": slurm}


@pytest.mark.parametrize(
    "given, winner",
    [
        ({"host_list", "hostfile", "operator", "slurm"}, "from-h"),
        ({"hostfile", "operator", "slurm"}, "from-hostfile"),
        ({"operator", "slurm"}, "from-operator"),
        ({"slurm"}, "from-slurm"),
    ],
)
def test_host_sources_follow_their_precedence(every_source, given, winner):
    found, _origin = hosts.resolve(
        host_list=every_source["host_list"] if "host_list" in given else None,
        hostfile=every_source["hostfile"] if "hostfile" in given else None,
        environ=every_source["slurm"] if "slurm" in given else {},
        operator_hostfile=every_source["operator"] if "operator" in given else NO_OPERATOR,
    )
    assert found == (Host(winner, 2),)


def test_without_any_source_the_job_is_local():
    assert hosts.resolve(environ={}, operator_hostfile=NO_OPERATOR) == ((), "localhost")


@pytest.mark.parametrize("entry", ["node1:", "node1:x", "node1:0", "node1:2:3", "", "bad host:2", "[x]:1"])
def test_a_malformed_host_entry_is_quoted_with_the_expected_format(entry):
    text = f"ok:2,{entry}"
    with pytest.raises(ConfigError) as info:
        hosts.parse_host_list(text)
    assert f"bad host entry {entry!r}" in str(info.value)
    assert "expected host:slots, e.g. node1:4" in str(info.value)


@pytest.mark.parametrize("line", ["node1 slots=two", "node1 slots=0", "node1 cores=4", "node1:x", "node1 slots"])
def test_a_malformed_hostfile_line_is_quoted_with_its_number_and_the_expected_format(line):
    with pytest.raises(ConfigError) as info:
        hosts.parse_hostfile(f"# header\nok slots=1\n{line}  # comment\n", source="my.hosts")
    message = str(info.value)
    assert f"my.hosts, line 3: bad entry {line!r}" in message
    assert "expected 'host slots=N' (Open MPI) or 'host:N' (horovodrun)" in message


def test_a_hostfile_of_only_comments_is_an_error_naming_the_file():
    with pytest.raises(ConfigError, match=r"empty\.hosts lists no hosts; expected 'host slots=N'"):
        hosts.parse_hostfile("# nothing\n\n", source="empty.hosts")


def test_a_missing_hostfile_is_named(tmp_path):
    with pytest.raises(ConfigError, match=r"cannot read hostfile '.*nope' \(No such file or directory\)"):
        hosts.read_hostfile(str(tmp_path / "nope"))


@pytest.mark.parametrize(
    "nodelist, bad", [("node[01-03", "node[01-03"), ("n[3-1]", "3-1"), ("a,,b", ""), ("n[x]", "x"), ("a b", "a b")]
)
def test_a_malformed_slurm_node_list_is_quoted(nodelist, bad):
    with pytest.raises(ConfigError) as info:
        hosts.expand_nodelist(nodelist)
    assert f"{bad!r} in SLURM node list {nodelist!r}; expected e.g. node[01-03,07]" in str(info.value)


def test_a_malformed_tasks_per_node_entry_is_quoted():
    with pytest.raises(ConfigError) as info:
        hosts.expand_tasks_per_node("2(3),1")
    assert "bad entry '2(3)' in SLURM_TASKS_PER_NODE='2(3),1'; expected e.g. 2(x3),1" in str(info.value)


def test_a_host_listed_twice_is_an_error():
    with pytest.raises(ConfigError, match="host 'a' is listed twice"):
        hosts.parse_host_list("a:2,b,a:1")


def test_more_processes_than_slots_states_the_slots_and_the_fixes():
    with pytest.raises(ConfigError) as info:
        hosts.check_slots(TWO_BY_TWO, 5, origin="--hostfile h.txt")
    message = str(info.value)
    assert "-np 5 needs 5 slots, more than the 4 from --hostfile h.txt (node1:2,node2:2)" in message
    assert "lower -np to 4 or add hosts or slots" in message


def test_a_job_spec_with_more_processes_than_slots_is_rejected_before_planning():
    with pytest.raises(ConfigError, match=r"-np 5 needs 5 slots, more than the 4 from the hosts given"):
        JobSpec(["python", "t.py"], 5, hosts=TWO_BY_TWO)
    assert JobSpec(["python", "t.py"], 4, hosts=list(TWO_BY_TWO)).hosts == TWO_BY_TWO


def _mpirun_tail(argv):
    assert os.path.basename(argv[0]) == "mpirun"
    return list(argv[1:])


def test_mpirun_plan_for_remote_hosts_names_them_and_exports_the_paths_that_are_set():
    plan = build(
        JobSpec(["python", "train.py"], 4, hosts=TWO_BY_TWO),
        is_root=False,
        cores=1,  # the local core count no longer matters: the hosts state their slots
        python=PY,
        base_env={"PATH": "/bin", "PYTHONPATH": "/src", "HOME": "/root"},
    )
    assert _mpirun_tail(plan.argv) == [
        "-np",
        "4",
        "-H",
        "node1:2,node2:2",
        *ACROSS_NOPREFIX,
        "--bind-to",
        "none",
        "--map-by",
        "slot",
        "--tag-output",
        "-x",
        "PATH",
        "-x",
        "PYTHONPATH",
        "-x",
        "PYTHONUNBUFFERED",
        "python",
        "train.py",
    ]


def test_mpirun_plan_from_a_hostfile_as_root_with_the_rank_wrapper(tmp_path):
    hostfile = tmp_path / "hosts"
    hostfile.write_text("a slots=1\nb:3\n")
    found, _ = hosts.resolve(hostfile=str(hostfile), environ={}, operator_hostfile=NO_OPERATOR)
    plan = build(
        JobSpec(["python", "t.py"], 3, hosts=found),
        is_root=True,
        cores=2,
        python=PY,
        job_id="j1",
        base_env={"PATH": "/bin", "LD_LIBRARY_PATH": "/lib"},
    )
    assert _mpirun_tail(plan.argv) == [
        "-np",
        "3",
        "-H",
        "a:1,b:3",
        "--allow-run-as-root",
        *ACROSS_NOPREFIX,
        "--bind-to",
        "none",
        "--map-by",
        "slot",
        "--tag-output",
        "-x",
        "HVDKIT_JOB_ID",
        "-x",
        "LD_LIBRARY_PATH",
        "-x",
        "PATH",
        "-x",
        "PYTHONUNBUFFERED",
        PY,
        "-m",
        "hvdkit.launcher.rankwrap",
        "--",
        "python",
        "t.py",
    ]


def test_mpirun_plan_inside_a_slurm_allocation():
    environ = {"SLURM_JOB_NODELIST": "cn[07-08]", "SLURM_TASKS_PER_NODE": "2(x2)", "PATH": "/bin"}
    found, _ = hosts.resolve(environ=environ, operator_hostfile=NO_OPERATOR)
    plan = build(JobSpec(["python", "t.py"], 4, hosts=found), is_root=False, cores=2, python=PY, base_env=environ)
    assert _mpirun_tail(plan.argv) == [
        "-np",
        "4",
        "-H",
        "cn07:2,cn08:2",
        *ACROSS_NOPREFIX,
        "--bind-to",
        "none",
        "--map-by",
        "slot",
        "--tag-output",
        "-x",
        "PATH",
        "-x",
        "PYTHONUNBUFFERED",
        "python",
        "t.py",
    ]


def test_localhost_hosts_need_no_oversubscribe_and_export_no_paths():
    spec = JobSpec(["python", "t.py"], 8, hosts=(Host("localhost", 8),))
    argv = build(spec, is_root=False, cores=2, python=PY, base_env={"PATH": "/bin"}).argv
    assert _mpirun_tail(argv)[:4] == ["-np", "8", "-H", "localhost:8"]
    assert "--oversubscribe" not in argv and "PATH" not in argv


def test_gloo_plan_passes_the_hosts_to_horovodrun():
    spec = JobSpec(["python", "t.py"], 3, controller="gloo", hosts=TWO_BY_TWO)
    argv = build(spec, is_root=True, cores=2, python=PY).argv
    assert os.path.basename(argv[0]) == "horovodrun"
    assert list(argv[1:]) == ["-np", "3", "-H", "node1:2,node2:2", "--gloo", "python", "t.py"]


def test_hvdkit_run_dry_run_prints_the_mpirun_line_for_the_given_hosts():
    env = {"PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}"}  # no LD_LIBRARY_PATH or PYTHONPATH to export
    out = subprocess.run(
        [HVDKIT, "run", "--dry-run", "-np", "4", "-H", "node1:2,node2:2", "--", "python", "examples/torch_digits.py"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    root = ["--allow-run-as-root"] if os.geteuid() == 0 else []
    mpirun = find_tool("mpirun", PYTHON)
    assert shlex.split(out.stdout) == [
        mpirun,
        "-np",
        "4",
        "-H",
        "node1:2,node2:2",
        *root,
        *([] if keeps_prefix(mpirun, local=False) else ["--noprefix"]),
        "--bind-to",
        "none",
        "--map-by",
        "slot",
        "--tag-output",
        "-x",
        "PATH",
        "-x",
        "PYTHONUNBUFFERED",
        "python",
        "examples/torch_digits.py",
    ]


@pytest.mark.parametrize("text", ["node1\n:2", "node1\r:2", "a:1,node1\n:2"])
def test_a_host_list_with_a_line_break_inside_a_host_name_is_rejected(text):
    # `$` in a regex also matches before a trailing newline: "node1\n" once passed as a host name
    # and went into mpirun's -H and the rendered files as a line break.
    with pytest.raises(ConfigError, match=r"bad host entry 'node1\\[nr]:2'"):
        hosts.parse_host_list(text)


@pytest.mark.parametrize("name", ["node1\n", "node1\r", "node\u2028", "n\x00", "node1\n\n"])
def test_a_host_name_with_a_line_break_or_control_character_is_not_a_host_name(name):
    with pytest.raises(ConfigError, match="is not a host name"):
        Host(name, 2)


@pytest.mark.parametrize(
    "expand, text",
    [
        (hosts.expand_nodelist, "n[1-100001]"),
        (hosts.expand_nodelist, "r[1-1000]-n[1-1000]"),
        (hosts.expand_tasks_per_node, "2(x100001)"),
        (hosts.expand_tasks_per_node, ",".join(["1(x50000)"] * 3)),
    ],
)
def test_a_slurm_list_of_more_than_max_nodes_is_an_error_not_a_huge_expansion(expand, text):
    # n[1-100000000000] would otherwise build a list of 10^11 names before any check.
    with pytest.raises(ConfigError, match="100000"):
        expand(text)


@pytest.mark.parametrize(
    "parse, text",
    [
        (hosts.parse_host_list, "a:" + "1" * 5000),
        (hosts.parse_hostfile, "a slots=" + "1" * 5000),
        (hosts.expand_nodelist, "n[" + "1" * 5000 + "]"),
        (hosts.expand_tasks_per_node, "1" * 5000),
    ],
)
def test_a_count_of_thousands_of_digits_is_a_config_error_not_a_crash(parse, text):
    # int() refuses strings of over 4300 digits with a plain ValueError, which `hvdkit run` does not catch.
    with pytest.raises(ConfigError):
        parse(text)


@pytest.mark.parametrize(
    "fields, message",
    [
        ({"command": ("python", "a\0b")}, r"command word 'a\\x00b' must be text without NUL"),
        ({"env": {"A": "x\0"}}, r"-x A 'x\\x00' must be text without NUL"),
        ({"env": {"A": 1}}, r"-x A 1 must be text"),
        ({"mpi_args": ("--mca", None)}, r"mpi argument None must be text"),
    ],
)
def test_a_job_spec_word_no_process_can_receive_is_a_config_error(fields, message):
    # Before: subprocess raised a bare ValueError ("embedded null byte") when the job started.
    with pytest.raises(ConfigError, match=message):
        JobSpec(**{"command": ("python", "train.py"), "num_proc": 1, **fields})

"""hvdkit.launcher: the pure planner, command checks and outcome reporting."""

import os
import shutil
import signal
import socket

import pytest

from hvdkit.core import ConfigError
from hvdkit.launcher import execute
from hvdkit.launcher.hosts import Host
from hvdkit.launcher.plan import SYSTEM_BIN, build, keeps_prefix
from hvdkit.launcher.remote import is_this_machine
from hvdkit.launcher.spec import JobSpec, check_command

PY = "/venv/bin/python"
BARE = {"PATH": "/nonexistent"}  # a PATH that finds no program: command names stay as given


def tail(argv, n):
    return list(argv[-n:])


def test_mpirun_plan_as_root_with_more_ranks_than_cores():
    plan = build(
        JobSpec(["python", "train.py", "--lr", "0.1"], 4), is_root=True, cores=2, python=PY, job_id="j1", base_env=BARE
    )
    argv = list(plan.argv)
    assert argv[1:3] == ["-np", "4"]
    assert "--allow-run-as-root" in argv and "--oversubscribe" in argv and "--tag-output" in argv
    assert tail(argv, 8) == [PY, "-m", "hvdkit.launcher.rankwrap", "--", "python", "train.py", "--lr", "0.1"]
    assert plan.env["HVDKIT_JOB_ID"] == "j1"
    # every variable hvdkit sets is exported to remote ranks too
    assert argv[argv.index("HVDKIT_JOB_ID") - 1] == "-x"


def test_mpirun_plan_as_user_within_the_cores_adds_neither_flag():
    argv = build(JobSpec(["python", "t.py"], 2), is_root=False, cores=2, python=PY, base_env=BARE).argv
    assert "--allow-run-as-root" not in argv and "--oversubscribe" not in argv
    assert tail(argv, 2) == ["python", "t.py"]  # no wrapper without a job id (dry run)


def test_a_local_job_runs_the_program_the_launching_shell_finds_and_mpirun_adds_no_prefix(tmp_path):
    # mpirun by full path acts as if given --prefix /usr: ranks got PATH=/usr/bin:... and `python3`
    # was the system's, not the virtualenv's (found on the H100 machine: No module named 'torch').
    venv_bin = tmp_path / "venv" / "bin"
    venv_bin.mkdir(parents=True)
    (venv_bin / "python3").symlink_to("/bin/sh")  # a virtualenv's python is a link: keep its own path
    env = {"PATH": f"{venv_bin}:/usr/bin:/bin"}
    for controller in ("mpi", "gloo"):
        spec = JobSpec(["python3", "t.py"], 2, controller=controller)
        argv = list(build(spec, is_root=False, cores=2, python=PY, base_env=env, job_id="j").argv)
        assert tail(argv, 2) == [str(venv_bin / "python3"), "t.py"]
        assert ("--noprefix" in argv) == (controller == "mpi")


def fake_venv(tmp_path):
    """A virtualenv's bin with python3 (a link, as in a real one) and an mpirun beside it."""
    venv_bin = tmp_path / "venv" / "bin"
    venv_bin.mkdir(parents=True)
    (venv_bin / "python3").symlink_to("/bin/sh")
    (venv_bin / "mpirun").write_text("#!/bin/sh\n")
    (venv_bin / "mpirun").chmod(0o755)
    return venv_bin


def exported(argv):
    return {argv[i + 1] for i, a in enumerate(argv) if a == "-x"}


def test_hosts_that_name_this_machine_otherwise_than_localhost_are_a_local_job(tmp_path):
    # -H $(hostname):2, or a one-node SLURM allocation (-H node:2), ran the system python3 on both
    # ranks: the host was not "localhost", so no --noprefix and no program resolved (issue 35, item 6).
    venv_bin = fake_venv(tmp_path)
    env = {"PATH": f"{venv_bin}:/usr/bin:/bin"}
    spec = JobSpec(["python3", "t.py"], 2, hosts=(Host("vm", 2),))
    argv = list(build(spec, is_root=False, cores=2, python=PY, base_env=env, here=lambda name: name == "vm").argv)
    assert tail(argv, 2) == [str(venv_bin / "python3"), "t.py"]
    assert "--noprefix" in argv and "PATH" not in exported(argv)
    # a name alone (no lookup) says nothing of the machine: planned as another host
    argv = list(build(spec, is_root=False, cores=2, python=PY, base_env=env).argv)
    assert tail(argv, 2) == ["python3", "t.py"] and "PATH" in exported(argv)


def test_mpirun_keeps_its_implied_prefix_only_across_hosts_and_outside_the_system_folders():
    for folder in ("/usr/bin", "/bin", "/usr/local/bin"):
        assert not keeps_prefix(f"{folder}/mpirun", local=False)  # every login PATH finds orted there
        assert not keeps_prefix(f"{folder}/mpirun", local=True)
    assert keeps_prefix("/opt/openmpi/bin/mpirun", local=False)  # the prefix is how other hosts find orted
    assert not keeps_prefix("/opt/openmpi/bin/mpirun", local=True)
    assert keeps_prefix("mpirun", local=False)  # a bare name implies no prefix: nothing to drop


def test_across_hosts_the_ranks_path_is_the_launching_shells_with_an_mpirun_of_a_system_folder(tmp_path):
    # mpirun's --prefix puts PREFIX/bin first on the ranks' PATH even over `-x PATH` (Open MPI
    # prepends it again): with /usr/bin/mpirun the ranks on other hosts ran /usr/bin/python3.
    mpirun = shutil.which("mpirun")
    if mpirun is None or os.path.dirname(mpirun) not in SYSTEM_BIN:
        pytest.skip(f"needs Open MPI's mpirun in a system folder ({sorted(SYSTEM_BIN)}); found {mpirun}")
    env = {"PATH": "/venv/bin:/usr/bin:/bin"}
    across = JobSpec(["python3", "t.py"], 4, hosts=(Host("a", 2), Host("b", 2)))
    argv = list(build(across, is_root=False, cores=2, python=PY, base_env=env).argv)
    assert argv[0] == mpirun and "--noprefix" in argv and "PATH" in exported(argv)
    assert tail(argv, 2) == ["python3", "t.py"]  # each host's PATH, the launcher's, finds it


def test_across_hosts_an_mpirun_outside_the_system_folders_keeps_its_prefix(tmp_path):
    venv_bin = fake_venv(tmp_path)
    across = JobSpec(["python3", "t.py"], 4, hosts=(Host("a", 2), Host("b", 2)))
    python = str(venv_bin / "python3")
    argv = list(build(across, is_root=False, cores=2, python=python, base_env={"PATH": "/usr/bin"}).argv)
    assert argv[0] == str(venv_bin / "mpirun") and "--noprefix" not in argv and "PATH" in exported(argv)


def test_every_name_and_address_of_this_machine_is_this_machine():
    for name in ("localhost", socket.gethostname(), socket.getfqdn(), "127.0.0.1", "127.0.0.2", "::1"):
        assert is_this_machine(name), name
    assert not is_this_machine("no-such-host.invalid")


def test_gloo_plan_uses_horovodrun_with_local_slots():
    argv = build(
        JobSpec(["python", "t.py"], 3, controller="gloo"), is_root=True, cores=2, python=PY, base_env=BARE
    ).argv
    assert list(argv[1:7]) == ["-np", "3", "-H", "localhost:3", "--gloo", "python"]
    assert "--allow-run-as-root" not in argv


def test_plan_is_argv_lists_never_a_shell_string():
    plan = build(JobSpec(["python", "a b.py", "; rm -rf /"], 1), is_root=False, cores=1, python=PY)
    assert plan.argv[-2:] == ("a b.py", "; rm -rf /")


def test_progress_is_left_alone_when_the_user_set_it():
    plan = build(JobSpec(["x"], 1), is_root=False, cores=1, progress=True, base_env={"HVDKIT_PROGRESS": "0"})
    assert "HVDKIT_PROGRESS" not in plan.env
    plan = build(JobSpec(["x"], 1), is_root=False, cores=1, progress=True, base_env={})
    assert plan.env["HVDKIT_PROGRESS"] == "1"


@pytest.mark.parametrize("bad", [0, -1, True, "2"])
def test_num_proc_below_one_is_rejected_naming_the_flag(bad):
    with pytest.raises(ConfigError, match=r"-np must be an integer >= 1 \(got"):
        JobSpec(["python", "t.py"], bad)


def test_empty_command_says_how_to_give_one():
    with pytest.raises(ConfigError, match="after '--'"):
        JobSpec([], 2)


def test_missing_script_is_named(tmp_path):
    with pytest.raises(ConfigError, match=r"script 'nope\.py' not found"):
        check_command(["python", "-u", "nope.py"], cwd=str(tmp_path))
    check_command(["python", "-m", "json.tool"], cwd=str(tmp_path))  # modules are not files


def test_unknown_program_is_named():
    with pytest.raises(ConfigError, match="'no-such-program-hvdkit' is not on PATH"):
        check_command(["no-such-program-hvdkit"])


@pytest.mark.parametrize(
    "line, expected",
    [
        ("[1,0]<stdout>:hello\n", ("stdout", "[rank 0] hello\n")),
        ("[1,1]<stderr>:oops\n", ("stderr", "[rank 1] oops\n")),
        ("[1]<stdout>:gloo line\n", ("stdout", "[rank 1] gloo line\n")),
        ("[1,1]<stderr>:[rank 1/2] hvdkit.x: msg\n", ("stderr", "[rank 1/2] hvdkit.x: msg\n")),
        ("mpirun noticed something\n", ("stderr", "mpirun noticed something\n")),
    ],
)
def test_launcher_tags_become_rank_tags(line, expected):
    assert execute.retag(line) == expected


def test_fragments_of_one_line_are_joined_and_ranks_kept_apart():
    demux = execute.LineDemux()
    # rank 0 printed its text and its newline in two writes; a line of rank 1 came in between
    assert demux.feed('[1,0]<stdout>:{"a": 1}[1,1]<stdout>:whole\n') == [("stdout", "[rank 1] whole\n")]
    assert demux.feed("[1,0]<stdout>:\n") == [("stdout", '[rank 0] {"a": 1}\n')]
    assert demux.feed("[1,1]<stdout>:half[1,0]<stdout>:next\n") == [("stdout", "[rank 0] next\n")]
    assert demux.feed("[1,1]<stdout>: done\n") == [("stdout", "[rank 1] half done\n")]


def test_launcher_text_and_unfinished_lines_are_not_lost():
    demux = execute.LineDemux()
    assert demux.feed("mpirun: note\n") == [("stderr", "mpirun: note\n")]
    assert demux.feed("[1,1]<stderr>:no newline at exit") == []
    assert demux.flush() == [("stderr", "[rank 1] no newline at exit\n")]


def _status(rank, ended, code=None, sig=None):
    return {"rank": rank, "exit_code": code, "signal": sig, "ended": ended, "host": "h", "seconds": 1.0}


def test_the_first_rank_to_fail_is_named_with_its_exit_code():
    statuses = {0: _status(0, 5.0, sig=signal.SIGTERM), 1: _status(1, 4.0, code=3)}
    result = execute._outcome(1, statuses, 2.0)
    assert (result.exit_code, result.failed_rank) == (3, 1)
    assert "rank 1 exited with code 3" in result.message


def test_a_rank_killed_by_a_signal_gives_128_plus_the_signal():
    result = execute._outcome(137, {0: _status(0, 1.0, code=0), 1: _status(1, 1.0, sig=9)}, 1.0)
    assert (result.exit_code, result.failed_rank, result.signal) == (137, 1, 9)
    assert "SIGKILL" in result.message


# What Open MPI 4.1's mpirun printed here when the process it started for rank 1 was SIGKILLed.
MPIRUN_KILLED = """--------------------------------------------------------------------------
Primary job  terminated normally, but 1 process returned
a non-zero exit code. Per user-direction, the job has been aborted.
--------------------------------------------------------------------------
--------------------------------------------------------------------------
mpirun noticed that process rank 1 with PID 0 on node vm exited on signal 9 (Killed).
--------------------------------------------------------------------------
"""


def test_the_launchers_word_on_a_rank_that_ended_is_read_from_its_own_lines():
    said = [execute.launcher_report(line) for line in MPIRUN_KILLED.splitlines(keepends=True)]
    assert [s for s in said if s] == [{"rank": 1, "signal": 9, "host": "vm", "by": "mpirun"}]
    assert execute.launcher_report("Process 1 exit with status code 137.\n") == {
        "rank": 1,
        "exit_code": 137,
        "by": "horovodrun",
    }  # horovodrun --gloo (gloo_run.py)
    assert execute.launcher_report("Process 0 exit with status code -9.\n")["signal"] == 9
    # a rank's own line saying the same is no launcher report
    assert execute.launcher_report("[rank 0] mpirun noticed that process rank 1 with PID 0 on node vm ...") is None


def test_a_rank_whose_wrapper_was_killed_is_named_from_the_launchers_report():
    # the wrapper itself SIGKILLed: no rank reported, and hvdkit run said only "the launcher exited
    # with 137 before any rank reported a failure" (issue 35, item 18)
    said = {"rank": 1, "signal": 9, "host": "vm", "by": "mpirun"}
    ended_by_mpirun = {0: _status(0, 1.0, sig=signal.SIGTERM)}  # rank 0, stopped by mpirun afterwards
    result = execute._outcome(137, ended_by_mpirun, 1.0, launcher_said=said)
    assert (result.exit_code, result.failed_rank, result.signal) == (137, 1, 9)
    assert result.message.startswith("rank 1 was killed by SIGKILL on vm (mpirun says so;")
    gloo = execute._outcome(1, {}, 1.0, launcher_said={"rank": 1, "exit_code": 137, "by": "horovodrun"})
    assert (gloo.exit_code, gloo.failed_rank) == (137, 1)
    assert gloo.message.startswith("rank 1 exited with code 137 (horovodrun says so;")
    # a rank that reported is named from its report
    reported = execute._outcome(1, {1: _status(1, 1.0, code=4)}, 1.0, launcher_said={**said, "signal": 15})
    assert (reported.exit_code, reported.failed_rank, reported.signal) == (4, 1, None)


def test_a_worker_the_launcher_names_is_no_failure_when_the_launcher_succeeded():
    # hvdkit run --horovod-elastic: Horovod's driver drops a worker whose host was removed (it exits
    # 134: "has been removed from elastic job", horovodrun prints "Process 1 exit with status code
    # 134.") and the job goes on; horovodrun exits 0, and so must hvdkit run (it exited 134)
    said = execute.launcher_report("Process 1 exit with status code 134.\n")
    result = execute._outcome(0, {}, 1.0, launcher_said=said)
    assert (result.exit_code, result.failed_rank, result.message) == (0, None, "")


def test_rank_reports_of_this_job_are_read_from_the_stream_and_others_are_not():
    from hvdkit.launcher.rankwrap import report_line

    reports = execute.RankReports("j1")
    exit_report = {"event": "exit", "rank": 0, "exit_code": None, "signal": 9, "host": "h", "seconds": 1.0}
    assert reports.take("[rank 1] " + report_line("j1", exit_report))["rank"] == 1  # the launcher's tag counts
    assert (reports.ended[1]["exit_code"], reports.ended[1]["signal"], reports.ended[1]["host"]) == (None, 9, "h")
    assert reports.take("[rank 0] " + report_line("j2", exit_report)) is None  # another job's: shown, not taken
    assert reports.take("[rank 0] hvdkit-rank j1 {not json}") is None
    assert list(reports.ended) == [1] and reports.started == {}


def test_in_process_workers_say_where_they_run_every_one_kept_newest_last(monkeypatch, capfd):
    """Horovod's elastic workers (no wrappers) come and go under one rank tag: each report is kept, a worker that
    says it again moves to the end (the newest), and a record without a usable host or pid is taken but not kept.
    The worker's side: a PreemptionGuard made under --recovery in-process writes the report on its rank."""
    from hvdkit.core import LocalCommunicator, env
    from hvdkit.core.preemption import PreemptionGuard
    from hvdkit.launcher.rankwrap import report_line

    reports = execute.RankReports("j1")
    for rank, host, pid in [(0, "a", 10), (1, "b", 11), (1, "b", 12), (0, "a", 10), (1, "b", 1), (1, 3, 13)]:
        line = f"[rank {rank}] " + report_line("j1", {"event": "worker", "host": host, "pid": pid})
        assert reports.take(line)["event"] == "worker"  # taken out of the output either way
    assert list(reports.workers) == [("b", 11), ("b", 12), ("a", 10)]
    assert reports.started == {} and not reports.training

    monkeypatch.setenv(env.JOB_ID, "j9")
    for recovery in ("restart", "in-process"):
        monkeypatch.setenv(env.RECOVERY, recovery)
        PreemptionGuard(LocalCommunicator()).close()
    said = [line for line in capfd.readouterr().err.splitlines() if line.startswith("hvdkit-rank j9 ")]
    assert len(said) == 1  # only under in-process
    record = execute.RankReports("j9").take("[rank 0] " + said[0])
    assert (record["event"], record["pid"], record["host"]) == ("worker", os.getpid(), socket.gethostname())


def test_network_interface_reaches_both_launchers():
    from hvdkit.launcher.hosts import Host

    hosts = (Host("a", 1), Host("b", 1))
    mpi = list(
        build(JobSpec(["python", "t.py"], 2, hosts=hosts, network_interface="eth1"), is_root=False, cores=2).argv
    )
    i = mpi.index("btl_tcp_if_include")
    assert mpi[i - 1 : i + 5] == ["--mca", "btl_tcp_if_include", "eth1", "--mca", "oob_tcp_if_include", "eth1"]
    gloo = list(
        build(
            JobSpec(["python", "t.py"], 2, controller="gloo", hosts=hosts, network_interface="eth1"),
            is_root=False,
            cores=2,
        ).argv
    )
    assert gloo[gloo.index("--network-interface") + 1] == "eth1"


def test_a_network_interface_that_is_not_one_name_is_rejected():
    with pytest.raises(ConfigError, match=r"--network-interface must name one interface.*'eth0 eth1'"):
        JobSpec(["python", "t.py"], 2, network_interface="eth0 eth1")


@pytest.mark.parametrize(
    "args, message",
    [
        (["--max-restarts", "-1"], "--max-restarts must be an integer >= 0 (got -1)"),
        (["--stall-timeout", "0"], "--stall-timeout must be a positive number of seconds (got 0.0)"),
        (["--grace-period", "-5"], "--grace-period must be a positive number of seconds (got -5.0)"),
    ],
)
def test_bad_fault_tolerance_settings_are_clear_errors(args, message, capsys):
    from hvdkit.cli import main

    assert main(["run", "-np", "1", *args, "--", "python", "-c", "pass"]) == 2
    assert message in capsys.readouterr().err


def test_the_restart_summary_names_every_failed_attempt():
    from hvdkit.launcher.attempts import FixedMembership, run_attempts

    crash = execute.JobResult(137, 1, None, 9, message="rank 1 was killed by SIGKILL on h after 3.0 s; job stopped")
    said = []
    history, final = run_attempts(FixedMembership((), 2), _ran(crash, execute.JobResult(0)), 1, log=said.append)
    assert len(history.attempts) == 2 and said == [f"{crash.message}; restarting (1/1)"]
    assert history.summary(final, elastic=False) == [
        "job finished after 1 restart used (attempt 1: rank 1 was killed by SIGKILL on h after 3.0 s; job stopped)"
    ]
    history, final = run_attempts(FixedMembership((), 2), _ran(crash, crash, crash), 2, log=said.append)
    assert final.exit_code == 137 and history.summary(final, elastic=False) == [
        f"{crash.message} (exit code 137; 2 restarts used); earlier: attempt 1: {crash.message}; attempt 2: "
        f"{crash.message}"
    ]
    history, final = run_attempts(FixedMembership((), 2), _ran(execute.JobResult(0)), 3, log=said.append)
    assert history.summary(final, elastic=False) == []


def test_a_fixed_size_job_stops_restarting_at_a_signal_to_the_launcher_and_exits_as_the_signal_would():
    from hvdkit.launcher.attempts import FixedMembership, run_attempts
    from hvdkit.launcher.job import exit_code

    stopped = execute.JobResult(0, interrupted_by=15)
    history, final = run_attempts(FixedMembership((), 2), _ran(stopped, execute.JobResult(0)), 3, log=print)
    assert len(history.attempts) == 1 and exit_code(final) == 143 and history.summary(final, elastic=False) == []
    failed = execute.JobResult(1, 0, 1, message="rank 0 exited with code 1", interrupted_by=15)
    history, final = run_attempts(FixedMembership((), 2), _ran(failed, execute.JobResult(0)), 3, log=print)
    assert len(history.attempts) == 1 and exit_code(final) == 1


def _ran(*results):
    """A ``launch`` for run_attempts whose attempts end with ``results``, in turn; each sees the same hosts."""
    results = iter(results)

    class Ran:
        def __init__(self, world, size):
            assert (world, size) == ((), 2)  # FixedMembership((), 2): this machine, -np 2
            self.result = next(results)

        def progress(self):
            return execute.RankProgress()

        def run(self, stop):
            return self.result

    return lambda world, size, attempt, changes: Ran(world, size)


def test_env_assignments_reach_every_rank_through_both_launchers(capsys):
    from hvdkit.cli import main
    from hvdkit.launcher.hosts import Host
    from hvdkit.launcher.spec import parse_env_vars

    env = parse_env_vars(["HVDKIT_NUM_THREADS=1", "A=x=y", "HOME"], {"HOME": "/h"})
    assert env == {"HVDKIT_NUM_THREADS": "1", "A": "x=y", "HOME": "/h"}
    hosts = (Host("a", 1), Host("b", 1))
    plan = build(JobSpec(["python", "t.py"], 2, hosts=hosts, env=env), is_root=False, cores=2)
    argv = list(plan.argv)
    exported = {argv[i + 1] for i, a in enumerate(argv) if a == "-x"}
    assert {"HVDKIT_NUM_THREADS", "A", "HOME"} <= exported  # mpirun exports them to remote ranks
    assert plan.env["HVDKIT_NUM_THREADS"] == "1" and plan.env["A"] == "x=y"
    gloo = build(JobSpec(["python", "t.py"], 2, controller="gloo", hosts=hosts, env=env), is_root=False, cores=2)
    assert gloo.env["HVDKIT_NUM_THREADS"] == "1"  # horovodrun passes its environment on
    assert main(["run", "-np", "2", "-x", "HVDKIT_NUM_THREADS=1", "--dry-run", "--", "python", "-c", "pass"]) == 0
    assert "-x HVDKIT_NUM_THREADS" in capsys.readouterr().out


@pytest.mark.parametrize(
    "item, message",
    [
        ("1BAD=x", "-x needs NAME or NAME=VALUE with NAME made of letters, digits and '_' (got '1BAD=x')"),
        ("=x", "(got '=x')"),
        ("A\n=1", "(got 'A\\n=1')"),
        ("HVDKIT_SURELY_UNSET_VAR", "-x HVDKIT_SURELY_UNSET_VAR: HVDKIT_SURELY_UNSET_VAR is not set in this shell"),
    ],
)
def test_bad_env_assignments_are_clear_errors(item, message):
    from hvdkit.launcher.spec import parse_env_vars

    with pytest.raises(ConfigError) as e:
        parse_env_vars([item], {})
    assert message in str(e.value)

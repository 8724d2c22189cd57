"""A stop reaches ranks on other hosts under Gloo: SIGTERM over ssh, by the host and pid a rank wrapper
reported, and only to a process that is that job's wrapper (never a reused pid)."""

import os
import signal
import subprocess
import sys
import time

from hvdkit.launcher.rank_signals import remote_rank_pids, remote_term_command, signal_remote


def test_only_ranks_of_other_hosts_are_remote():
    started = {0: {"host": "here", "pid": 10}, 1: {"host": "b", "pid": 11}, 2: {"host": "c", "pid": 1}, 3: {"pid": 5}}
    assert remote_rank_pids(started, host="here") == [("b", 11)]


def _sleeper(job_id):
    env = dict(os.environ, HVDKIT_JOB_ID=job_id)
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], env=env, start_new_session=True)


def test_the_remote_command_terminates_the_jobs_wrapper_and_nothing_else():
    mine, other = _sleeper("job-1"), _sleeper("job-2")
    try:
        for proc in (mine, other):
            subprocess.run(["sh", "-c", remote_term_command(proc.pid, "job-1")], timeout=30)
        assert mine.wait(timeout=10) == -signal.SIGTERM
        time.sleep(0.2)
        assert other.poll() is None  # another job's process with a pid the report could have named
    finally:
        for proc in (mine, other):
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


def test_every_remote_rank_is_asked_over_ssh_at_once():
    asked = []
    thread = signal_remote([("b", 11), ("c", 12)], "job-1", ssh=lambda host, argv, timeout: asked.append((host, argv)))
    thread.join(5)
    time.sleep(0.2)  # the per-host threads
    assert sorted(h for h, _ in asked) == ["b", "c"]
    assert all(argv[:2] == ["sh", "-c"] and "kill -TERM" in argv[2] for _, argv in asked)
    assert signal_remote([], "job-1") is None and signal_remote([("b", 1)], None) is None


def test_guarded_ranks_need_one_signal_unguarded_ones_all():
    from hvdkit.launcher.rank_signals import remote_ranks_to_stop

    remote = [("b", 11), ("b", 12), ("c", 13)]
    assert remote_ranks_to_stop(remote, local=[7], guarded=True) == []  # the local ranks' signal carries the stop
    assert remote_ranks_to_stop(remote, local=[], guarded=True) == [("b", 11)]  # the first remote rank
    assert remote_ranks_to_stop(remote, local=[7], guarded=False) == remote
    assert remote_rank_pids({1: {"host": "c", "pid": 13}, 0: {"host": "b", "pid": 11}}, host="a") == [
        ("b", 11),
        ("c", 13),
    ]


def _ssh_here(asked):
    """An ``ssh(host, argv, timeout)`` that runs the remote command on this machine, as sshd would (one shell
    command line), and records the hosts asked."""

    def ssh(host, argv, timeout):
        asked.append(host)
        p = subprocess.run(" ".join(argv), shell=True, capture_output=True, text=True, timeout=timeout)
        return p.returncode, p.stdout + p.stderr

    return ssh


def test_an_in_process_stop_reaches_one_live_worker_of_the_job_trying_host_by_host():
    """`--recovery in-process` workers (no wrappers) said where they run; the first listed may be gone (killed) or
    its pid reused by another job: the stop goes to the first that is still this job's, and to no other host."""
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    other, mine, spare = _sleeper("job-2"), _sleeper("job-1"), _sleeper("job-1")
    try:
        asked = []
        workers = [("b", gone.pid), ("b", other.pid), ("c", mine.pid), ("d", spare.pid)]
        from hvdkit.launcher.rank_signals import signal_one_remote

        signal_one_remote(workers, "job-1", ssh=_ssh_here(asked)).join(30)
        assert asked == ["b", "c"]  # b had none of the job's workers left; c had one; d was not asked
        assert mine.wait(timeout=10) == -signal.SIGTERM
        time.sleep(0.2)
        assert other.poll() is None and spare.poll() is None
        assert signal_one_remote([], "job-1") is None and signal_one_remote([("b", 5)], None) is None
    finally:
        for proc in (other, mine, spare):
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()

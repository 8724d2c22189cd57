"""A real multi-host job: two hosts made of network namespaces on this machine, sshd in each.

`hvdkit run -H a:1,b:1` trains the torch digits example across them over MPI and over Gloo and
must reach exactly what the same job reaches on one host. Both runs use one intra-op thread per
rank: by default a rank alone on a host takes every core, and with more threads torch's kernels may
sum in another order (on AVX-512 CPUs they do), which moves the result in the last digits.
Needs root (namespaces, mounts).
"""

import time

import pytest
from helpers import (
    HVDKIT,
    PYTHON,
    ROOT,
    fixed_compression,  # noqa: F401 - autouse: HVDKIT_COMPRESSION=fp16 for this module's runs
    hvdkit_run,
    result_line,
    run_bounded,
)
from netns import NEEDS_HOSTS, open_hosts

pytestmark = [
    pytest.mark.dist,
    *NEEDS_HOSTS,
]
EXAMPLE = str(ROOT / "examples" / "torch_digits.py")
SAME_THREADS = ("-x", "HVDKIT_NUM_THREADS=1")  # like with like: one thread per rank on one host and on two
THREADS_LINE = "1 thread(s) per rank"  # what rank 0 logs at start-up


def check_threads(proc):
    assert THREADS_LINE in proc.stdout + proc.stderr, "the run did not use one thread per rank"


@pytest.fixture(scope="module")
def hosts():
    yield from open_hosts()  # checks that nothing the test made survives it


@pytest.fixture(scope="module")
def one_host_result(tmp_path_factory):
    proc = hvdkit_run(
        "-np", "2", *SAME_THREADS, "--", PYTHON, EXAMPLE, "--checkpoint-dir", str(tmp_path_factory.mktemp("one") / "c")
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    check_threads(proc)
    return result_line(proc.stdout)


def run_on_a(hosts, *args, timeout=240):
    argv = hosts.argv_on(0, [HVDKIT, *args])
    return run_bounded(argv, timeout)


@pytest.mark.parametrize("controller", ["mpi", "gloo"])
def test_training_across_two_hosts_reaches_what_one_host_reaches(hosts, one_host_result, tmp_path, controller):
    a, b = hosts.names
    gloo = ["--gloo"] if controller == "gloo" else []
    proc = run_on_a(
        hosts,
        "run",
        "-np",
        "2",
        *gloo,
        "-H",
        f"{a}:1,{b}:1",
        "--network-interface",
        "hvd0",
        *SAME_THREADS,
        "--",
        PYTHON,
        EXAMPLE,
        "--checkpoint-dir",
        str(tmp_path / "c"),
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    check_threads(proc)
    r = result_line(proc.stdout)
    assert r["world_size"] == 2 and r["val_accuracy"] >= 0.95
    assert (r["val_accuracy"], r["val_loss"]) == (one_host_result["val_accuracy"], one_host_result["val_loss"])


def test_doctor_checks_every_host_the_route_and_an_allreduce_across_them(hosts):
    a, b = hosts.names
    proc = run_on_a(hosts, "doctor", "--hosts", f"{a}:1,{b}:1", "--network-interface", "hvd0")
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    out = proc.stdout
    assert f"host {a}" in out and "this machine" in out
    assert f"host {b}" in out and "reachable, same versions" in out
    assert f"via hvd0 (from {hosts.addresses[0]})" in out
    assert "2-rank allreduce across hosts ok (sum over 2 ranks = 3)" in out


def test_an_unreachable_host_is_an_error_before_anything_starts(hosts):
    a = hosts.names[0]
    missing = hosts.addresses[0].rsplit(".", 1)[0] + ".9"  # in the test subnet, but nobody is there
    t0 = time.monotonic()
    proc = run_on_a(hosts, "run", "-np", "2", "-H", f"{a}:1,{missing}:1", "--", PYTHON, EXAMPLE, timeout=60)
    assert proc.returncode == 2
    assert f"cannot reach {missing} over ssh" in proc.stderr
    assert "epoch" not in proc.stderr and time.monotonic() - t0 < 30


@pytest.mark.parametrize("controller", ["mpi", "gloo"])
def test_the_launchers_horovod_nccl_and_hvdkit_settings_reach_the_ranks_on_both_hosts(hosts, controller):
    """Open MPI sends no variable to another host unless told; horovodrun sends its environment. Both
    ways, a setting exported where `hvdkit run` starts holds for every rank on every host."""
    a, b = hosts.names
    gloo = ["--gloo"] if controller == "gloo" else []
    names = ["HOROVOD_CYCLE_TIME", "NCCL_DEBUG", "HVDKIT_NUM_THREADS"]
    probe = (
        f"import os, socket; print('SEEN', socket.gethostname(), *(os.environ.get(v) for v in {names!r}), flush=True)"
    )
    argv = hosts.argv_on(
        0,
        [
            "env",
            "HOROVOD_CYCLE_TIME=7",
            "NCCL_DEBUG=WARN",
            "HVDKIT_NUM_THREADS=1",
            HVDKIT,
            "run",
            "-np",
            "2",
            *gloo,
            "-H",
            f"{a}:1,{b}:1",
            "--network-interface",
            "hvd0",
            "--",
            PYTHON,
            "-c",
            probe,
        ],
    )
    proc = run_bounded(argv, 240)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    seen = sorted(line.split("SEEN ", 1)[1].split() for line in proc.stdout.splitlines() if "SEEN " in line)
    assert seen == [[a, "7", "WARN", "1"], [b, "7", "WARN", "1"]], proc.stdout


@pytest.mark.parametrize("controller", ["mpi", "gloo", "in-process"])
def test_sigterm_to_the_launcher_stops_ranks_on_another_host_at_a_checkpointed_step(hosts, tmp_path, controller):
    """Every rank on the other host, none on the launcher's: mpirun passes SIGUSR1 on; horovodrun passes
    nothing, so the launcher sends SIGTERM over ssh to the pids the rank wrappers reported (issue 21
    item 10); under `--recovery in-process` (Horovod's elastic driver, no rank wrappers) to a worker that said
    where it runs. Either way the ranks stop together at one step, checkpoint it, and exit cleanly. Before, an
    in-process job's workers on other hosts heard nothing until the grace period ended."""
    import os
    import signal
    import subprocess

    from helpers import BIN

    from hvdkit.core.checkpoint.state import read_newest

    a, b = hosts.names
    d = tmp_path / "ckpt"
    in_process = ["--min-np", "1", "--max-np", "2", "--recovery", "in-process"]
    gloo = {"gloo": ["--gloo"], "in-process": in_process}.get(controller, [])
    argv = [
        HVDKIT,
        "run",
        "-np",
        "2",
        *gloo,
        "-H",
        f"{b}:2",
        "--network-interface",
        "hvd0",
        *SAME_THREADS,
        "--",
        PYTHON,
        EXAMPLE,
        "--epochs",
        "200",
        "--checkpoint-dir",
        str(d),
    ]
    env = dict(os.environ, PYTHONUNBUFFERED="1", PATH=f"{BIN}{os.pathsep}{os.environ['PATH']}")
    proc = subprocess.Popen(
        hosts.argv_on(0, argv),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=ROOT,
        start_new_session=True,
        stdin=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 180
        while not (d.exists() and len([p for p in os.listdir(d) if p.startswith("ckpt-")]) >= 2):  # two epochs done
            assert time.monotonic() < deadline and proc.poll() is None, "the job never got through two epochs"
            time.sleep(0.1)
        os.kill(proc.pid, signal.SIGTERM)  # `hvdkit run` itself (in_host.sh and unshare exec it)
        signalled = time.monotonic()
        out, err = proc.communicate(timeout=120)
        seconds = time.monotonic() - signalled
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 128 + signal.SIGTERM, err[-3000:]
    assert "stopped by SIGTERM" in err and "every rank exited cleanly" in err, err[-3000:]
    stopped = result_line(out)
    assert stopped["preempted"] is True
    assert read_newest(d).step == stopped["steps"]  # a checkpoint of the very step it stopped at
    assert seconds < 25, f"{seconds:.1f} s: the stop waited for the grace period (30 s) instead of the ranks"

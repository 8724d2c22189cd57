"""Helpers for tests: run real ranks under mpirun or horovodrun, bounded in time."""

import fcntl
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PYTHON = sys.executable
BIN = Path(PYTHON).parent
LAUNCHERS = ("mpirun", "horovodrun-gloo")
HVDKIT = str(BIN / "hvdkit")


@pytest.fixture(scope="module", autouse=True)
def fixed_compression():
    """The examples default to compression="auto", timed anew in every run: pin fp16 so runs compared exactly
    choose alike. Autouse in a test module that imports it (module scope: set before its module fixtures run)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HVDKIT_COMPRESSION", "fp16")
        yield


def launcher_argv(launcher, np_):
    """The launcher command line for ``np_`` local ranks: raw mpirun/horovodrun, or ``hvdkit run``."""
    if launcher == "mpirun":
        argv = ["mpirun", "-np", str(np_), "--bind-to", "none", "--oversubscribe"]
        if os.geteuid() == 0:
            argv.append("--allow-run-as-root")
        return argv
    if launcher == "horovodrun-gloo":
        return [str(BIN / "horovodrun"), "-np", str(np_), "-H", f"localhost:{np_}", "--gloo"]
    if launcher == "hvdkit-run":
        return [HVDKIT, "run", "-np", str(np_), "--"]
    raise ValueError(launcher)


def pid_running(pid):
    """True while ``pid`` exists and is not a zombie waiting for its parent."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def wait_until_gone(pids, bound):
    """``(seconds, still running)``: how long until none of ``pids`` runs (polled every 50 ms, at most ``bound`` s)."""
    t0 = time.monotonic()
    while any(pid_running(pid) for pid in pids) and time.monotonic() - t0 < bound:
        time.sleep(0.05)
    return time.monotonic() - t0, sorted(pid for pid in pids if pid_running(pid))


def end_job(pids, proc):
    """What a test started, ended whatever happened: each of ``pids`` still running (by pid) and
    ``proc``'s process group, if it still runs."""
    for pid in pids:
        if pid_running(pid):
            os.kill(pid, signal.SIGKILL)
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def _end_group(proc, term_grace):
    """End ``proc``'s process group (SIGTERM and ``term_grace`` seconds first, when given); its output."""
    if term_grace:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            return proc.communicate(timeout=term_grace)
        except subprocess.TimeoutExpired:
            pass
    os.killpg(proc.pid, signal.SIGKILL)
    return proc.communicate()


def probe_json(code, timeout=240):
    """Run ``code`` in a fresh Python of the venv (``run_bounded``); the JSON object its last line of output
    prints. It must exit 0, and its ``"hvdkit"`` entry (the package's file, when given) be this tree's."""
    proc = run_bounded([PYTHON, "-c", code], timeout=timeout)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert str(got.get("hvdkit", ROOT / "hvdkit")).startswith(str(ROOT / "hvdkit")), got.get("hvdkit")
    return got


def probe_fixture(code, timeout=240):
    """A module fixture named ``seen``: ``probe_json(code)``, run once for the module's tests; the probe must say
    which hvdkit it ran (a ``"hvdkit"`` entry, this tree's)."""

    @pytest.fixture(scope="module")
    def seen():
        got = probe_json(code, timeout)
        assert "hvdkit" in got
        return got

    return seen


def run_bounded(argv, timeout, env=None, cwd=None, term_grace=None, cleanup=None):
    """Run ``argv`` in its own process group; kill the whole group if it outlives ``timeout``
    (``term_grace`` seconds: SIGTERM first, so that it can clean up, and SIGKILL after that long).
    ``cleanup(pid)`` runs at the end in any case (to remove what a killed run left)."""
    full_env = dict(os.environ, PYTHONUNBUFFERED="1")
    full_env["PATH"] = f"{BIN}{os.pathsep}{full_env.get('PATH', '')}"
    full_env.update(env or {})
    proc = subprocess.Popen(
        argv,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=full_env,
        cwd=cwd or ROOT,
        start_new_session=True,
        stdin=subprocess.DEVNULL,
    )
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        out, err = _end_group(proc, term_grace)
        pytest.fail(
            f"{argv[:4]}... did not finish within {timeout} s (hang?)\nstdout:\n{out[-3000:]}\nstderr:\n{err[-3000:]}"
        )
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # no stray ranks survive a test
        except ProcessLookupError:
            pass
        if cleanup is not None:
            cleanup(proc.pid)
    return subprocess.CompletedProcess(argv, proc.returncode, out, err)


def run_ranks(launcher, np_, script_args, timeout=300, env=None):
    return run_bounded(launcher_argv(launcher, np_) + [PYTHON, *script_args], timeout, env=env)


def run_contract_worker(launcher, worker, out, np_=2, timeout=300, args=()):
    """Run a contract worker on ``np_`` real ranks (``args`` after ``out`` on its command line); every rank's
    recorded JSON, by rank."""
    proc = run_ranks(launcher, np_, [str(worker), str(out), *args], timeout=timeout)
    assert proc.returncode == 0, f"{launcher} job failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
    results = []
    for r in range(np_):
        with open(out / f"rank{r}.json") as f:
            results.append(json.load(f))
    return results


def run_example(np_, argv, timeout=600):
    """``PYTHON argv`` on ``np_`` real ranks under mpirun; fails the test with its output unless every rank ends 0."""
    proc = run_ranks("mpirun", np_, argv, timeout=timeout)
    assert proc.returncode == 0, f"{np_} rank(s) failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}"
    return proc


def last_json_line(stdout):
    """The last line of ``stdout`` that is a JSON object (an example's result line under plain mpirun)."""
    return json.loads([line for line in stdout.splitlines() if line.startswith("{")][-1])


def hvdkit_run(*args, timeout=300):
    return run_bounded([HVDKIT, "run", *args], timeout)


def result_line(stdout):
    """The example's final JSON line (printed by rank 0, tagged by the launcher)."""
    lines = [line.split("] ", 1)[1] for line in stdout.splitlines() if line.startswith("[rank 0] {")]
    assert len(lines) == 1, stdout
    return json.loads(lines[0])


def record_figures(test, *, path=None, **figures):
    """Append what a fault test measured to build/reliability.json (for docs/reliability.md). The suite's job
    lanes (tests/conftest.py) run fault tests at once in separate processes: the read-modify-write holds an
    exclusive lock on a file beside it, and the new file replaces the old whole (a reader never sees half)."""
    path = Path(path) if path is not None else ROOT / "build" / "reliability.json"
    path.parent.mkdir(exist_ok=True)
    with open(path.with_name(path.name + ".lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        rows = json.loads(path.read_text()) if path.exists() else []
        rows = [r for r in rows if r["test"] != test] + [{"test": test, **figures}]
        tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(rows, indent=1))
        os.replace(tmp, path)


def read_sample_logs(prefix):
    """Every line the examples' ``--sample-log PREFIX`` wrote (``PREFIX.rank<r>`` files, all ranks,
    all attempts), as dicts: ``{"epoch", "step", "rank", "size", "indices"}``."""
    lines = []
    for name in sorted(os.listdir(prefix.parent)):
        if name.startswith(prefix.name + ".rank"):
            with open(prefix.parent / name) as f:
                lines += [json.loads(line) for line in f]
    return lines

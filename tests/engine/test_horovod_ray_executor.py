"""``horovod.ray.RayExecutor`` (static) on hvdkit's engine and a local Ray 2.60 (issue 27, item 5).

Torch and Keras 3 jobs of 2 Ray workers train with Horovod's optimizer and get the known averaged
step; the executor's Ray calls raise no DeprecationWarning (engine fix 05); a function that raises on
one rank comes back promptly as an error naming that rank, and the job's workers end (fix 06; upstream
raised one actor's bare exception and left the other rank waiting in its collective); every process
of the job is gone after ``executor.shutdown()`` and ``ray.shutdown()``.
"""

import json
import os
import signal

import numpy as np
import pytest
from helpers import PYTHON, ROOT, run_bounded

pytestmark = pytest.mark.dist
SCRIPT = ROOT / "tests" / "engine" / "scripts" / "hvd_ray_executor.py"


MODES = ("torch", "torch_colocated", "keras", "raise", "elastic", "elastic_legacy")


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """Every mode's report, by mode, and the run's output: one driver runs them all on one local Ray (each mode
    with an executor of its own), which starts once instead of six times (10-25 s each on 2 busy cores)."""
    tmp_path = tmp_path_factory.mktemp("ray-executor")
    pids_file = tmp_path / "pids"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HOROVOD_", "OMPI_", "RAY_"))}
    env["PYTHONWARNINGS"] = "always::DeprecationWarning"  # the Ray workers inherit it and show theirs

    def end_leftovers(_pid):  # Ray's processes start their own sessions: end each one this job started
        if pids_file.exists():
            for pid in {int(p) for p in pids_file.read_text().split()}:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass

    argv = [PYTHON, str(SCRIPT), ",".join(MODES), str(pids_file)]
    proc = run_bounded(argv, 540, env=env, cwd=ROOT, cleanup=end_leftovers)  # inside pytest's 600 s per test
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    lines = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    assert [line.get("mode") for line in lines] == [*MODES, None], lines
    *reports, whole = lines
    assert whole["ray_processes"] > 2, whole  # raylet, GCS and the workers were seen under the driver
    assert whole["after_ray_shutdown"] == [], whole  # nothing of any mode's job outlived ray.shutdown()
    return {r["mode"]: r for r in reports}, proc.stdout + proc.stderr


def _run(run, mode):
    """``mode``'s report (its workers gone after its executor's shutdown) and the run's output."""
    reports, output = run
    out = reports[mode]
    assert out["workers_after_executor_shutdown"] == [], out
    return out, output


def _by_rank(out):
    results = sorted(out["results"], key=lambda r: r["rank"])
    assert [r["rank"] for r in results] == [0, 1] and {r["size"] for r in results} == {2}
    assert sorted(r["pid"] for r in results) == out["worker_pids"]  # one Ray worker process per rank
    return results


@pytest.mark.parametrize("mode", ["torch", "torch_colocated"])
def test_a_torch_job_averages_gradients_and_raises_no_deprecation_warning(run, mode):
    out, output = _run(run, mode)
    for r in _by_rank(out):
        assert r["sum"] == 3.0  # 1 + 2
        # rank 0's [1, -2] broadcast; gradients (r + 1) * [1, 1] averaged: 1.5; lr 0.1
        assert r["weights"][0] == pytest.approx([0.85, -2.15], rel=1e-6)
    assert out["deprecations"] == []
    assert "DeprecationWarning" not in output, output[-4000:]  # the workers' own (node_id) included


def test_a_keras_fit_averages_gradients_and_metrics_on_every_worker(run):
    out, _ = _run(run, "keras")
    w = np.array([1.0, -0.5])  # rank 0's weights, broadcast at the start of fit
    losses = []
    for _ in range(2):  # mse of x * w with x = c * [1, 1] (c = rank + 1), y = 0: gradient 2 c^2 (w1 + w2)
        s = w.sum()
        losses.append(np.mean([(c * s) ** 2 for c in (1, 2)]))
        w = w - 0.01 * np.mean([2 * c * c * s for c in (1, 2)])
    for r in _by_rank(out):
        assert r["sum"] == 3.0
        assert np.ravel(r["weights"]) == pytest.approx(w, rel=1e-5)
        assert r["loss"] == pytest.approx(losses, rel=1e-5)  # MetricAverageCallback: the mean over ranks


def test_an_exception_on_one_rank_comes_back_naming_that_rank_and_ends_the_job(run):
    out, _ = _run(run, "raise")
    assert out["error"] == "RuntimeError"
    assert out["message"].startswith("horovod.ray: the function raised ValueError on rank 1: a bad value on rank one")
    assert out["run_s"] < 120  # rank 0 waited in its allreduce: it was ended, not waited for


@pytest.mark.parametrize("mode", ["elastic", "elastic_legacy"])
def test_an_elastic_job_on_one_ray_node_starts_at_once_and_recovers_from_the_last_commit(run, mode):
    # Upstream waited for a second node until the elastic timeout (60 s here; 600 s by default), and
    # with fix 03 its rendezvous refused the workers' unsigned registrations (fix 07).
    out, _ = _run(run, mode)
    assert (out["forged_put_status"], out["forged_pickle_ran"]) == (403, False)  # registrations are signed
    assert out["fault_injected"] is True
    results = sorted(out["results"], key=lambda r: r["rank"])
    assert [(r["rank"], r["size"], r["steps"], r["sum"]) for r in results] == [(0, 2, 3, 3.0), (1, 2, 3, 3.0)]
    for r in results:  # 3 committed steps of the averaged gradient 1.5 (the failed step was rolled back)
        assert r["weights"][0] == pytest.approx([1.0 - 3 * 0.15, -2.0 - 3 * 0.15], rel=1e-6)

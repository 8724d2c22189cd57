"""`hvdkit tune --seed S` interrupted by SIGINT and run again resumes the study with new parameters: no
parameter set of the first run is drawn again (the sampler was seeded afresh with S on every run, so
the first new trial repeated trial 0). A SIGINT that comes while a trial is being launched stops that
trial too (it was handed to the signal handler only after its launch, and ran to the end). Trials are
tests/e2e/scripts/tune_tiny_trial.py (no framework)."""

import csv
import io
import os
import signal
import subprocess

import pytest
from helpers import HVDKIT, PYTHON, ROOT
from tune_jobs import interrupt_after_complete, wait_group_gone

from hvdkit.tune.config import TuneConfig
from hvdkit.tune.runner import LocalRunner
from hvdkit.tune.space import parse_space
from hvdkit.tune.study import Driver
from hvdkit.tune.workers import JOB_ATTR

pytestmark = pytest.mark.dist
optuna = pytest.importorskip("optuna")
TINY = "tests/e2e/scripts/tune_tiny_trial.py"


def test_a_seeded_study_resumed_after_sigint_draws_no_parameter_set_again(tmp_path):
    space = tmp_path / "space.yaml"
    space.write_text("x: {type: float, low: 1.0, high: 2.0}\n")
    out = tmp_path / "o"
    argv = [HVDKIT, "tune", "--space", str(space), "--metric", "loss", "--mode", "min", "--out", str(out)]
    argv += ["--trials", "3", "--pruner", "none", "--seed", "0", "--", PYTHON, TINY, "--epochs", "2"]
    argv += ["--trial-dir", "{trial_dir}"]
    code, first = interrupt_after_complete(argv, 1)
    assert code == 130, first
    second = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert second.returncode == 0, second.stdout[-4000:] + second.stderr[-3000:]
    with open(out / "trials.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert sum(r["state"] == "COMPLETE" for r in rows) == 3
    # each parameter set has one key (its folder); an interrupted trial reruns under its own key
    keys_of = {}
    for r in rows:
        keys_of.setdefault(r["x"], set()).add(r["key"])
    assert all(len(keys) == 1 for keys in keys_of.values()), rows
    assert len(keys_of) == len({r["key"] for r in rows}) >= 3


class _SigintAtLaunch(LocalRunner):
    """Starts the trial's ``hvdkit run``, then sends this process SIGINT before ``start`` returns: a Ctrl-C
    at the moment a trial is launched, before the driver holds the started job."""

    def start(self, launch):
        job = super().start(launch)
        os.kill(os.getpid(), signal.SIGINT)  # the driver's handler runs here, before start returns
        return job


def test_a_sigint_while_a_trial_is_launched_stops_that_trial(tmp_path):
    cfg = TuneConfig(
        space=parse_space({"x": {"type": "float", "low": 1.0, "high": 2.0}}),
        metric="loss",
        mode="min",
        trials=1,
        command=(PYTHON, str(ROOT / TINY), "--epochs", "20", "--trial-dir", "{trial_dir}"),  # 20 epochs: >= 3 s
        pruner="none",
        out=str(tmp_path / "o"),
    )
    stream = io.StringIO()
    driver = Driver(cfg, runner=_SigintAtLaunch(), stream=stream)
    assert driver.run() == 130, stream.getvalue()
    trials = driver.study.get_trials()
    assert [t.state.name for t in trials] == ["FAIL", "WAITING"], stream.getvalue()  # stopped, queued again
    assert trials[0].user_attrs["hvdkit_error"].startswith("interrupted by SIGINT sent to hvdkit tune")
    wait_group_gone(trials[0].user_attrs[JOB_ATTR])
    assert not (tmp_path / "o" / "trials" / "0000" / "done.rank0").exists()  # it did not run to its end
    assert "interrupted by SIGINT: run the same command again to resume" in stream.getvalue()

"""Experiment tracking on 2 real ranks with uneven shards: rank 0 alone writes the job-wide metrics.

tests/distributed/workers/tracking_contracts.py trains with torch and with Keras ``fit``, in the pool's
jobs under mpirun; every rank gives the tracker the same directory. One controller suffices: rank 0
alone writes, and the averaging it writes is the one test_torch_contracts checks under mpirun and Gloo. Each test
reads TensorBoard's event file (with TensorBoard's own reader) or the MLflow store back and compares
with the metrics over all ten samples, computed without the averaging under test.
"""

import json
import os

import pool
import pytest

pytest.importorskip("tensorboard")
pytest.importorskip("mlflow")
import tensorboard.compat  # noqa: E402
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator  # noqa: E402

pytestmark = pytest.mark.dist
EPOCHS = 3
# TensorBoard reads records with TensorFlow's reader when TensorFlow is installed; importing it
# sets environment variables, so do it at collection, not inside a test.
assert tensorboard.compat.tf.__version__


def run_job(framework, launcher, out):
    # as inside a trial of `hvdkit tune`: every rank's tracker also reports to this file (rank 0 only writes)
    env = {"HVDKIT_TUNE_REPORT": str(out / "tune-reports.jsonl")}
    pool.run_case(launcher, framework, "tracking_contracts:main", args=[framework, str(out)], timeout=300, env=env)
    ranks = [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]
    acc = EventAccumulator(str(out / "runs"))
    acc.Reload()
    return {"out": out, "r": ranks, "tb": acc}


@pytest.fixture(scope="module", params=["mpirun"])
def torch_job(request, tmp_path_factory):
    return run_job("torch", request.param, tmp_path_factory.mktemp(f"track-torch-{request.param}"))


@pytest.fixture(scope="module")
def keras_job(tmp_path_factory):
    return run_job("keras", "mpirun", tmp_path_factory.mktemp("track-keras"))


def scalars(job, tag):
    return [(e.step, e.value) for e in job["tb"].Scalars(tag)]


def check_mlflow_run(job, params, metrics):
    """Rank 0's MLflow run finished and holds ``params`` (name -> text) and, for each name in
    ``metrics``, one value per epoch equal to ``metrics[name]``; all its params and metric histories."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{job['out'] / 'runs' / 'mlflow.db'}")
    run = client.get_run(job["r"][0]["run_id"])
    history = {
        k: sorted((m.step, m.value) for m in client.get_metric_history(run.info.run_id, k)) for k in run.data.metrics
    }
    assert run.info.status == "FINISHED"
    assert {k: run.data.params.get(k) for k in params} == params
    for name, values in metrics.items():
        assert history[name] == list(enumerate(values)), name
    return run.data.params, history


def only_rank0_wrote(job):
    r0, r1 = job["r"]
    files = sorted(os.listdir(job["out"] / "runs"))
    events = [f for f in files if "tfevents" in f]
    assert events == [os.path.basename(r0["event_file"])] and f".{r0['pid']}.hvdkit" in events[0]
    assert set(files) - set(events) <= {"mlflow.db"}  # and no rank-1 event file nor store
    assert (r1["event_file"], r1["run_id"]) == (None, None) and r0["run_id"]
    assert r0["closed"] and r1["closed"]


# --- torch: a tiny loop, hk.average_metrics, hk.Tracker -------------------------------------------


def expected_torch(epoch):
    """Sample i (0..9) has loss (i - epoch)^2 and is correct when i > epoch + 4: over all ten samples."""
    return {
        "loss": sum((i - epoch) ** 2 for i in range(10)) / 10,
        "accuracy": sum(i > epoch + 4 for i in range(10)) / 10,
    }


def test_torch_event_file_holds_the_metrics_over_all_ten_samples_at_each_epoch(torch_job):
    assert scalars(torch_job, "loss") == [(e, expected_torch(e)["loss"]) for e in range(EPOCHS)]  # 28.5, 20.5, 14.5
    assert scalars(torch_job, "accuracy") == [
        (e, pytest.approx(expected_torch(e)["accuracy"], rel=1e-6)) for e in range(EPOCHS)
    ]
    # each rank's own numbers are not the job's: the averaging did the work
    for r in torch_job["r"]:
        assert r["local"][0]["loss"] != pytest.approx(expected_torch(0)["loss"])


def test_torch_only_rank0_writes_files_in_the_shared_directory(torch_job):
    only_rank0_wrote(torch_job)


def test_torch_mlflow_run_holds_world_size_params_and_metrics(torch_job):
    expected = {
        name: [pytest.approx(expected_torch(e)[name], rel=1e-12) for e in range(EPOCHS)]
        for name in ("loss", "accuracy")
    }
    p, _ = check_mlflow_run(torch_job, {"world_size": "2", "lr": "0.05", "batch_size": "4", "model": "tiny"}, expected)
    assert p["torch_version"].startswith("2.") and "horovod_version" in p


def test_torch_a_nan_metric_is_the_same_clear_error_on_every_rank(torch_job):
    for r in torch_job["r"]:
        assert r["nan_error"].startswith("metric 'loss' is nan at step 3")
    assert len(torch_job["tb"].Scalars("loss")) == EPOCHS  # nothing written for it


# --- Keras: fit with MetricAverageCallback, then TrackMetricsCallback -----------------------------

KERAS_TAGS = ("loss", "accuracy", "val_loss", "val_accuracy")


def test_keras_event_file_holds_fits_metrics_over_all_ten_samples(keras_job):
    reference = keras_job["r"][0]["reference"]
    for tag in KERAS_TAGS:
        expect = [(e, pytest.approx(reference[e][tag], rel=1e-5, abs=1e-6)) for e in range(EPOCHS)]
        assert scalars(keras_job, tag) == expect, tag
    # the loss moved (lr > 0), and rank 0's own loss is not the job's
    assert reference[0]["loss"] != pytest.approx(reference[-1]["loss"], rel=1e-4)
    assert keras_job["r"][0]["local"][0]["loss"] != pytest.approx(reference[0]["loss"], rel=1e-3)


def test_keras_event_file_holds_the_learning_rate_and_history_agrees(keras_job):
    assert scalars(keras_job, "learning_rate") == [(e, pytest.approx(0.05, rel=1e-6)) for e in range(EPOCHS)]
    history = keras_job["r"][0]["history"]
    assert scalars(keras_job, "val_loss") == [
        (e, pytest.approx(v, rel=1e-6)) for e, v in enumerate(history["val_loss"])
    ]


def test_keras_only_rank0_writes_files_in_the_shared_directory(keras_job):
    only_rank0_wrote(keras_job)


def test_keras_mlflow_run_holds_world_size_fit_params_and_metrics(keras_job):
    reference = keras_job["r"][0]["reference"]
    expected = {
        tag: [pytest.approx(reference[e][tag], rel=1e-5, abs=1e-6) for e in range(EPOCHS)] for tag in KERAS_TAGS
    }
    fit_params = {"world_size": "2", "epochs": "3", "steps_per_epoch": "1", "optimizer": "SGD", "lr": "0.05"}
    p, history = check_mlflow_run(keras_job, fit_params, expected)
    assert p["tensorflow_version"].startswith("2.") and p["keras_version"].startswith("3.")
    assert [s for s, _ in history["learning_rate"]] == list(range(EPOCHS))


# --- inside a trial of `hvdkit tune`: the tracker reports what it logs, from rank 0 only ---------------


def tune_reports(job):
    from hvdkit.core.tune_channel import read_reports

    return read_reports(str(job["out"] / "tune-reports.jsonl"))[0]


def test_torch_tracker_reports_each_epoch_to_the_tune_trial_once(torch_job):
    records = tune_reports(torch_job)  # one line per epoch: rank 1 wrote none, the NaN was refused
    assert [(r["epoch"], r["metrics"]["loss"]) for r in records] == [
        (e, expected_torch(e)["loss"]) for e in range(EPOCHS)
    ]


def test_keras_track_metrics_callback_reports_fits_metrics_to_the_tune_trial_once(keras_job):
    records = tune_reports(keras_job)
    assert [r["epoch"] for r in records] == list(range(EPOCHS))
    assert [(r["epoch"], r["metrics"]["val_loss"]) for r in records] == [
        (step, pytest.approx(value, rel=1e-6)) for step, value in scalars(keras_job, "val_loss")
    ]

"""The report channel of hvdkit tune: hvdkit.tune.report writes one JSON line per call on rank 0 inside a
trial only, and read_reports gives back exactly what was written, also when it reads mid-line."""

import math
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hvdkit.core.comm import LocalCommunicator
from hvdkit.core.errors import ConfigError
from hvdkit.core.monitoring.tracking import Tracker
from hvdkit.core.tune_channel import read_reports, report_from
from hvdkit.tune import report

METRICS = st.dictionaries(
    st.text(min_size=1, max_size=10), st.floats(allow_nan=False, allow_infinity=False), max_size=4
)


def test_report_is_a_no_op_outside_a_trial_and_writes_rank_0_s_values_inside(tmp_path, monkeypatch):
    path = tmp_path / "reports.jsonl"
    report(0, val_loss=1.0)  # no HVDKIT_TUNE_REPORT: nothing, no error
    monkeypatch.setenv("HVDKIT_TUNE_REPORT", str(path))
    monkeypatch.setenv("OMPI_COMM_WORLD_RANK", "1")
    monkeypatch.setenv("OMPI_COMM_WORLD_SIZE", "2")
    report(0, val_loss=9.0)  # rank 1: ignored
    assert not path.exists()
    monkeypatch.setenv("OMPI_COMM_WORLD_RANK", "0")
    report(0, val_loss=0.5, acc=1)
    report(1, val_loss=0.25)
    assert read_reports(str(path)) == (
        [{"epoch": 0, "metrics": {"val_loss": 0.5, "acc": 1.0}}, {"epoch": 1, "metrics": {"val_loss": 0.25}}],
        path.stat().st_size,
    )


def test_bad_epochs_and_values_are_config_errors_naming_them(tmp_path, monkeypatch):
    monkeypatch.setenv("HVDKIT_TUNE_REPORT", str(tmp_path / "r.jsonl"))
    with pytest.raises(ConfigError, match=r"epoch must be an integer >= 0 \(got -1\)"):
        report(-1, loss=1.0)
    with pytest.raises(ConfigError, match=r"epoch must be an integer >= 0 \(got True\)"):
        report(True, loss=1.0)
    with pytest.raises(ConfigError, match="metric 'loss' must be a number"):
        report(0, loss="low")


def test_nan_travels_as_nan_so_the_driver_sees_a_diverged_trial(tmp_path, monkeypatch):
    path = tmp_path / "r.jsonl"
    monkeypatch.setenv("HVDKIT_TUNE_REPORT", str(path))
    report_from(0, 3, {"loss": math.nan})
    (record,), _ = read_reports(str(path))
    assert record["epoch"] == 3 and math.isnan(record["metrics"]["loss"])


@given(st.lists(st.tuples(st.integers(0, 10**6), METRICS), max_size=6), st.data())
@settings(max_examples=100, deadline=None)
def test_reading_at_any_byte_boundary_yields_every_record_once_in_order(tmp_path_factory, records, data):
    import os

    path = tmp_path_factory.mktemp("ch") / "r.jsonl"
    os.environ["HVDKIT_TUNE_REPORT"] = str(path)
    try:
        for epoch, metrics in records:
            report_from(0, epoch, metrics)
    finally:
        del os.environ["HVDKIT_TUNE_REPORT"]
    raw = path.read_bytes() if records else b""
    cut = data.draw(st.integers(0, len(raw)))
    partial = path.with_suffix(".part")
    partial.write_bytes(raw[:cut])  # what a reader finds while the writer is mid-way
    first, offset = read_reports(str(partial), 0)
    partial.write_bytes(raw)
    rest, end = read_reports(str(partial), offset)
    assert [(r["epoch"], r["metrics"]) for r in first + rest] == [
        (e, {k: float(v) for k, v in m.items()}) for e, m in records
    ]
    assert end == len(raw)


def test_importing_hvdkit_tune_loads_no_framework_and_no_optuna():
    code = (
        "import sys, hvdkit.tune; hvdkit.tune.report(0, loss=1.0); "
        "print(sorted(m for m in ('torch', 'tensorflow', 'horovod', 'optuna', 'numpy') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True).stdout
    assert out.strip() == "[]"


class _Rank1(LocalCommunicator):
    rank = 1
    size = 2


def test_a_tracker_reports_what_it_logs_to_the_trial_from_rank_0_only(tmp_path, monkeypatch):
    path = tmp_path / "r.jsonl"
    monkeypatch.setenv("HVDKIT_TUNE_REPORT", str(path))
    with Tracker(LocalCommunicator(), tmp_path / "tb", backends=()) as t:
        t.log_metrics({"val_loss": 0.75, "val_accuracy": 0.5}, step=2)
    with Tracker(_Rank1(), tmp_path / "tb1", backends=()) as t:
        t.log_metrics({"val_loss": 99.0}, step=2)
    assert read_reports(str(path))[0] == [{"epoch": 2, "metrics": {"val_loss": 0.75, "val_accuracy": 0.5}}]

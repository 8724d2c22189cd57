"""End to end: `hvdkit run --timeline` on 2 real ranks, then `hvdkit timeline` on the file rank 0 wrote."""

import json

import pytest
from helpers import HVDKIT, PYTHON, run_bounded

from hvdkit.diagnostics import timeline

pytestmark = pytest.mark.dist
JOB = "tests/e2e/scripts/timeline_job.py"
STEPS = 4
# horovod.torch records allreduce "tl.small" as "allreduce.tl.small"; float32 values of 4 bytes
TENSORS = {"allreduce.tl.small": 16, "allreduce.tl.medium": 4096, "allreduce.tl.large": 262144}
PNG = b"\x89PNG\r\n\x1a\n"


def traced_job(folder, *flags, env=None):
    """Run the job on 2 ranks with a timeline in a folder that does not exist yet; summarise it."""
    tl = folder / "new" / "tl.json"
    proc = run_bounded(
        [HVDKIT, "run", "--timeline", str(tl), *flags, "-np", "2", "--", PYTHON, JOB, str(STEPS)], 60, env=env
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"hvdkit timeline {tl}" in proc.stderr
    out_json, out_png = folder / "summary.json", folder / "plot.png"
    report = run_bounded(
        [HVDKIT, "timeline", str(tl), "--json", str(out_json), "--plot", str(out_png), "--top", "3"], 60
    )
    assert report.returncode == 0, report.stdout + report.stderr
    return {
        "path": tl,
        "report": report.stdout,
        "summary": json.loads(out_json.read_text()),
        "png": out_png.read_bytes(),
    }


@pytest.fixture(scope="module")
def mpi(tmp_path_factory):
    return traced_job(tmp_path_factory.mktemp("mpi"))


@pytest.fixture(scope="module")
def gloo(tmp_path_factory):
    """Over Gloo, with cycle markers and the response cache off, so every negotiation records its ticks."""
    return traced_job(
        tmp_path_factory.mktemp("gloo"), "--gloo", "--timeline-mark-cycles", env={"HOROVOD_CACHE_CAPACITY": "0"}
    )


@pytest.fixture(params=["mpi", "gloo"])
def job(request):
    return request.getfixturevalue(request.param)


def tensors(summary):
    return {t["name"]: t for t in summary["tensors"]}


def test_every_named_allreduce_is_counted_once_with_its_size(job):
    found = tensors(job["summary"])
    assert set(found) == set(TENSORS)
    for name, n in TENSORS.items():
        t = found[name]
        assert (t["ops"], t["op_kinds"], t["negotiations"]) == (STEPS, {"ALLREDUCE": STEPS}, STEPS)
        assert (t["dtype"], t["shape"], t["bytes"]) == ("float32", [n], 4 * n)
    assert job["summary"]["largest"] == ["allreduce.tl.large", "allreduce.tl.medium", "allreduce.tl.small"]


def test_activity_times_add_up_to_each_tensors_operation_time(job):
    for t in job["summary"]["tensors"]:
        assert sum(t["activities"].values()) == t["op_us"] > 0
        assert t["activities"]["(other)"] >= 0


def test_the_controllers_own_allreduce_is_the_communication(mpi, gloo):
    assert all("MPI_ALLREDUCE" in t["activities"] for t in mpi["summary"]["tensors"])
    assert all("GLOO_ALLREDUCE" in t["activities"] for t in gloo["summary"]["tensors"])
    for job, name in ((mpi, "MPI_ALLREDUCE"), (gloo, "GLOO_ALLREDUCE")):
        per_tensor = [t["activities"][name] for t in job["summary"]["tensors"]]
        # the union of busy time: at least the busiest tensor's, at most all of them without overlap
        assert 0 < max(per_tensor) <= job["summary"]["breakdown"]["communication"] <= sum(per_tensor)


def test_the_span_breakdown_adds_up_and_its_fractions_sum_to_one(job):
    s = job["summary"]
    assert s["span_us"] > 0 and sum(s["breakdown"].values()) == s["span_us"]
    assert min(s["breakdown"].values()) >= 0
    assert sum(s["fractions"].values()) == pytest.approx(1.0, abs=1e-9)


def test_readiness_accounts_for_every_negotiation_with_ticks_from_both_ranks(job):
    rd = job["summary"]["readiness"]
    assert rd["negotiations"] == STEPS * len(TENSORS) and rd["ranks"] == [0, 1]
    assert sum(rd["last"].values()) + rd["together"] + rd["single_rank"] == rd["with_ticks"] >= 1


def test_without_the_response_cache_every_negotiation_records_both_ranks(gloo):
    rd = gloo["summary"]["readiness"]
    assert (rd["with_ticks"], rd["without_ticks"], rd["single_rank"]) == (STEPS * len(TENSORS), 0, 0)


def test_cycle_markers_appear_only_when_asked_for(mpi, gloo):
    assert mpi["summary"]["cycles"] == 0 and gloo["summary"]["cycles"] >= STEPS


def test_the_printed_report_names_the_tensors_and_the_plot_is_a_png(job):
    text = job["report"]
    assert "(written by rank 0): 3 tensors, 12 operations" in text
    assert "allreduce.tl.large" in text and "1.0 MiB" in text and "communication (MPI_/GLOO_/NCCL_ activities)" in text
    assert job["png"][:8] == PNG and len(job["png"]) > 10_000


def test_the_real_timeline_cut_anywhere_still_gives_consistent_sums(mpi, tmp_path):
    data = mpi["path"].read_bytes()
    cut_file = tmp_path / "cut.json"
    for i in range(1, 20):  # rank 0 killed while writing: the file ends at any byte
        cut_file.write_bytes(data[: len(data) * i // 20])
        s = timeline.summarise(cut_file)
        assert s.truncated and sum(s.breakdown.values()) == s.span_us
        assert all(t.ops <= STEPS and sum(t.activities.values()) == t.op_us for t in s.tensors)

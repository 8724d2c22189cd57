"""`python -m benchmarks network --link 1gbit --quick`: the network section on two real namespace hosts, tbf-shaped.

Untimed: --quick runs each job once on tiny sizes. The tests check the results' structure, that
every variant computed the right sum across the hosts, that the shaped link really limited what
crossed it (a bandwidth over the rate would mean the bytes did not cross the link), and that
nothing the run made survives it. Needs root (namespaces, mounts, tc).
"""

import json
import os
import shutil
import subprocess

import pytest
from helpers import PYTHON, run_bounded

from hvdkit.core.horovod_settings import DEFAULTS

pytestmark = [
    pytest.mark.dist,
    pytest.mark.skipif(os.geteuid() != 0, reason="network namespaces, mounts and tc need root"),
    pytest.mark.skipif(
        not (shutil.which("ip") and shutil.which("tc") and os.path.exists("/usr/sbin/sshd")),
        reason="needs iproute2 and openssh-server (make setup installs them)",
    ),
]
RATE = 10**9
MARGIN = 1.15  # token-bucket burst and timer granularity; a link that shapes nothing gives ~10x
TIMEOUT = 900


def _remove_hosts(pid):
    """The lab names its hosts after its pid; after a kill, remove what it left."""
    for host in "ab":
        ns = f"hvdb{pid % 10000}{host}"
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        shutil.rmtree(f"/etc/netns/{ns}", ignore_errors=True)


def run_bench(argv, timeout):
    """Run the lab in its own process group (cwd: the repository root); on a hang SIGTERM it (it closes its
    hosts), then kill."""
    proc = run_bounded(argv, timeout, term_grace=60, cleanup=_remove_hosts)
    return proc.returncode, proc.stdout, proc.stderr


@pytest.fixture(scope="module")
def quick(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench-network")
    docs = out / "benchmarks.md"
    docs.write_text("# Benchmarks\n\n<!-- bench:network:begin -->\nold\n<!-- bench:network:end -->\n\ntail\n")
    argv = [PYTHON, "-m", "benchmarks", "network", "--link", "1gbit", "--quick", "--out", str(out), "--docs", str(docs)]
    rc, stdout, stderr = run_bench(argv, TIMEOUT)
    assert rc == 0, stdout[-3000:] + stderr[-5000:]
    with open(out / "results.json", encoding="utf-8") as f:
        return out, json.load(f), stdout


def test_the_link_is_shaped_to_the_rate_and_the_raw_tcp_stream_stays_under_it(quick):
    _, r, _ = quick
    link = r["links"]["1gbit"]
    assert link["rate_bits_per_s"] == RATE and "tbf" in link["qdisc"] and "rate 1Gbit" in link["qdisc"]
    assert 0 < link["tcp"]["median_bits_per_s"] <= MARGIN * RATE


@pytest.mark.parametrize("job,controller", [("comm_mpi", "mpi"), ("comm_gloo", "gloo")])
def test_every_allreduce_across_the_hosts_returns_the_sum_and_stays_under_the_shaped_rate(quick, job, controller):
    _, r, _ = quick
    comm = r["links"]["1gbit"][job]
    assert comm["controller"] == controller and comm["size"] == 2
    rows = [x for x in comm["sweep"] if x["variant"] not in ("fp16_wire_ratio", "memcpy")]
    expected = {f"hvd_{controller}", f"hvd_{controller}_fp16", "torch_gloo"} | (
        {"mpi4py"} if controller == "mpi" else set()
    )
    assert {x["variant"] for x in rows} == expected
    for x in rows:
        assert x["check_max_abs_diff"] <= (1e-2 if x["variant"].endswith("fp16") else 0.0), x
        # fp16 sends half the bytes, so its bandwidth counted in fp32 bytes may reach twice the rate
        ceiling = MARGIN * RATE * (2 if x["variant"].endswith("fp16") else 1)
        if x["bytes"] >= 256 << 10:  # small sizes fit the token bucket's burst
            assert 0 < x["bandwidth_Bps"] * 8 <= ceiling, x


def test_training_across_the_hosts_ends_identical_on_both_and_records_what_auto_picks(quick):
    _, r, _ = quick
    train = r["links"]["1gbit"]["train"]
    assert set(train["variants"]) == {"single", "compute_only", "hvdkit", "horovod", "ddp", "hvdkit_fp16"}
    checks = train["checks"]
    assert [checks[f"{v}_across_ranks"] for v in ("hvdkit", "horovod", "ddp", "hvdkit_fp16")] == [0.0] * 4
    assert checks["horovod_vs_hvdkit"] <= 1e-5 and checks["hvdkit_fp16_vs_hvdkit"] <= 1e-2
    auto = train["auto_compression"]
    if auto is not None:  # None only where this hvdkit has no compression="auto"
        assert auto["choice"] in ("none", "fp16") and auto["fp32_s"] > 0 and auto["fp16_s"] > 0


def test_settings_jobs_apply_horovods_defaults_and_hvdkits_and_report_ratios(quick):
    _, r, _ = quick
    tuned = r["tuned"]
    assert set(tuned["runs"]) == {"horovod defaults", "hvdkit defaults"}
    assert r["latency"]["settings"]["horovod defaults"] == {
        "HOROVOD_CYCLE_TIME": "1",
        "HOROVOD_CACHE_CAPACITY": "1024",
        "HOROVOD_FUSION_THRESHOLD": str(128 << 20),
    }
    cycle = "HOROVOD_CYCLE_TIME"  # hvdkit.torch.init set hvdkit's value on both hosts; the other job set Horovod's
    assert [run["horovod_env"][cycle] for run in tuned["runs"]["hvdkit defaults"]] == [DEFAULTS["mpi"][cycle]]
    assert [run["horovod_env"][cycle] for run in tuned["runs"]["horovod defaults"]] == ["1"]
    s = tuned["summary"]
    expected = s["default_step_s"] / s["tuned_step_s"]
    assert s["engine_settings"]["ratio"] == pytest.approx(expected) and s["fp16_gain"]["ratio"] > 0
    for row in r["latency"]["link_1gbit"].values():
        assert row["allreduce_4k_s"] > 0 and row["step_s"] > 0


def test_the_run_writes_a_table_plots_and_the_docs_section_and_leaves_nothing_behind(quick):
    out, r, stdout = quick
    assert "link 1gbit: raw TCP stream" in stdout and "compression='auto' at each link" in stdout
    for png in ("network_bandwidth.png", "network_steps.png"):
        data = (out / png).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000
    docs = (out / "benchmarks.md").read_text()
    assert (
        "old" not in docs
        and docs.endswith("tail\n")
        and "| 1gbit |" in docs
        and "![network_bandwidth](network_bandwidth.png)" in docs
    )
    assert r["leftovers"] == []
    namespaces = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.split()
    assert not set(r["host_names"]) & set(namespaces)

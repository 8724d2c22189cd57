"""`hvdkit bench --quick`: every benchmark variant runs on real ranks and computes the right result.

Untimed: --quick uses tiny sizes and one repetition, and this test asserts the workers' correctness
checks and the suite's outputs, never a timing.
"""

import json

import pytest
from helpers import HVDKIT, run_bounded

from hvdkit.bench.jobs import netns_wrapper

pytestmark = pytest.mark.dist


@pytest.fixture(scope="module")
def quick(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench")
    # About 2 minutes of the budget are section (h)'s three jobs (one per ZeRO-1 variant for its memory).
    proc = run_bounded([HVDKIT, "bench", "--quick", "--out", str(out)], timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    with open(out / "results.json", encoding="utf-8") as f:
        return out, json.load(f), proc.stdout


@pytest.mark.parametrize("job,controller", [("comm_mpi", "mpi"), ("comm_gloo", "gloo")])
def test_every_allreduce_variant_returns_the_sum_over_ranks(quick, job, controller):
    _, r, _ = quick
    assert r[job]["controller"] == controller and r[job]["size"] == 2
    rows = [x for x in r[job]["sweep"] if x["variant"] != "fp16_wire_ratio"]
    variants = {x["variant"] for x in rows}
    expected = {f"hvd_{controller}", f"hvd_{controller}_fp16", "torch_gloo", "memcpy"} | (
        {"mpi4py"} if controller == "mpi" else set()
    )
    assert variants == expected
    for x in rows:
        tol = 1e-2 if x["variant"].endswith("fp16") else 0.0
        assert x["check_max_abs_diff"] <= tol, x
        assert x["median_s"] > 0 and x["bandwidth_Bps"] > 0


@pytest.mark.parametrize("job", ["comm_mpi", "comm_gloo"])
def test_fp16_compression_sends_exactly_half_the_bytes(quick, job):
    _, r, _ = quick
    ratios = [x["value"] for x in r[job]["sweep"] if x["variant"] == "fp16_wire_ratio"]
    assert ratios and all(v == 0.5 for v in ratios)


@pytest.mark.parametrize("job", ["comm_mpi", "comm_gloo"])
def test_fused_unfused_grouped_and_single_tensor_allreduces_agree(quick, job):
    _, r, _ = quick
    fusion = r[job]["fusion"]
    assert set(fusion["variants"]) == {"unfused", "fused", "grouped", "one_tensor"}
    assert all(v["check_max_abs_diff"] == 0.0 for v in fusion["variants"].values())


def test_training_variants_end_identical_across_ranks_and_with_each_other(quick):
    _, r, _ = quick
    checks = r["train_torch"]["checks"]
    assert {k: v for k, v in checks.items() if k.endswith("across_ranks")} == {
        "hvdkit_across_ranks": 0.0,
        "horovod_across_ranks": 0.0,
        "ddp_across_ranks": 0.0,
    }
    assert checks["horovod_vs_hvdkit"] <= 1e-5 and checks["ddp_vs_hvdkit"] <= 1e-5
    assert set(r["train_torch"]["variants"]) == {"single", "compute_only", "hvdkit", "horovod", "ddp"}
    keras = r["train_keras"]["checks"]
    assert keras["hvdkit_across_ranks"] == 0.0 and keras["hvdkit_vs_one_process_double_batch"] <= 1e-5


def test_checkpoints_read_back_equal_and_startup_reaches_every_rank(quick):
    _, r, _ = quick
    assert r["checkpoint"]["checks"] == {"torch_save": 0.0, "torch_save_fsync": 0.0, "hvdkit": 0.0}
    assert set(r["startup"]["variants"]) == {"mpirun", "hvdkit_run"}


def test_zero1_section_halves_the_adam_state_and_counts_the_bytes_of_one_allreduce_on_the_wire(quick):
    _, r, stdout = quick
    z = r["zero"]
    t = z["time"]
    assert t["checks"] == {
        "plain_across_ranks": 0.0,
        "sharded_across_ranks": 0.0,
        "sharded_vs_plain_rel": 0.0,
        "overlap_vs_serial": 0.0,  # the reduce-scatter overlapped with backward changes no bit
    }
    overlap = t["overlap"]  # the sharded step timed beside itself with overlap = False
    assert overlap["serial"]["median_s"] > 0 and overlap["speedup"] > 0
    assert overlap["rounds"]["overlapped"] == overlap["rounds"]["rounds"] >= 1  # every round started in backward
    assert "reduce-scatter overlapped with backward: throughput" in stdout
    params = t["model"]["parameters"]
    # Adam: exp_avg + exp_avg_sq (4 bytes each) per parameter and a 4-byte step count per tensor: 5
    # unsharded (embedding, two Linear weights and biases), 1 sharded (one flat slice).
    assert t["state_bytes_per_rank"]["plain"] == [8 * params + 4 * 5] * 2
    halves = [(params + 1) // 2, params // 2]  # Horovod's cut: the first rank holds the odd element
    assert t["state_bytes_per_rank"]["sharded"] == [8 * n + 4 for n in halves]
    assert t["ring_bytes_sent_per_step"] == {"plain": 4 * params, "sharded": 4 * params}
    assert t["collective_bytes_per_step"]["sharded"]["reducescatter"] == [4 * params, 4 * halves[0]]
    assert {k: v["median_s"] > 0 for k, v in t["comm_only"].items()} == {
        "allreduce": True,
        "reducescatter_allgather": True,
    }
    # Where a private network namespace can be made (root here), the Gloo jobs ran in one and counted
    # their bytes on lo; elsewhere the section says why and records memory only.
    netns = netns_wrapper()[0] is not None
    assert z["netns"] is netns
    for v in ("plain", "sharded"):
        part = z[v]
        assert part["private_netns"] is netns and all(rk["peak_reset"] for rk in part["ranks"])
        assert [rk["state_bytes"] for rk in part["ranks"]] == t["state_bytes_per_rank"][v]
        assert all(rk["peak_rss_bytes"] >= rk["rss_end_bytes"] > 0 for rk in part["ranks"])
        if netns:  # at least the payload went through lo (headers and Horovod's control traffic on top)
            assert part["wire"]["raw_bytes_per_rank_per_step"] >= 4 * params
        else:
            assert part["wire"] is None and "bytes on the wire not measured" in z["netns_note"]
    assert "(h) ZeRO-1 optimizer state sharding" in stdout and "sharded / plain: state 0.50" in stdout


def test_the_suite_writes_goals_a_table_and_plots(quick):
    out, r, stdout = quick
    names = [g["name"] for g in r["goals"]]
    assert "hvdkit / raw Horovod training throughput" in names and len(names) == 11
    state = next(g for g in r["goals"] if g["name"] == "ZeRO-1 Adam state per rank / unsharded")
    assert state["met"] is True and abs(state["value"] - 0.5) < 0.01  # 5 step counts unsharded, 1 sharded
    assert "Goals (ratios from this run):" in stdout and "(a) allreduce bus bandwidth" in stdout
    for png in ("bandwidth.png", "scaling.png", "zero.png"):
        data = (out / png).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000
    md = (out / "results.md").read_text()
    assert "| goal | measured | target |" in md and "![bandwidth](bandwidth.png)" in md


@pytest.fixture(scope="module")
def breakdown(tmp_path_factory):
    """``hvdkit bench --breakdown --quick``: its two 2-rank jobs (hvdkit's defaults, Horovod's), toy models."""
    out = tmp_path_factory.mktemp("breakdown")
    proc = run_bounded([HVDKIT, "bench", "--breakdown", "--quick", "--out", str(out)], timeout=400)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    with open(out / "step_sweep.json", encoding="utf-8") as f:
        return out, json.load(f), proc.stdout


def test_the_breakdown_cuts_every_step_into_phases_that_sum_to_it(breakdown):
    _, r, _ = breakdown
    assert r["complete"] and not r["dry_run"] and r["plan"] == ["hvdkit defaults", "Horovod defaults"]
    variants = {"hvdkit defaults": {"ddp", "hvdkit", "hvdkit_bucket"}, "Horovod defaults": {"ddp", "hvdkit"}}
    for job in r["jobs"]:
        assert "error" not in job and "skipped" not in job, job
        assert set(job["result"]["models"]) == {"tiny_mlp", "tiny_bert"}
        for model in job["result"]["models"].values():
            assert set(model["variants"]) == variants[job["label"]]
            assert model["comm_alone_s"]["horovod"] > 0 and model["comm_alone_s"]["ddp"] > 0
            for v in model["variants"].values():
                assert len(v["steps"]) == 4  # --quick: 2 interleaved runs of 2 timed steps
                for step in v["steps"]:
                    assert set(step) == {"forward", "backward", "exposed_comm", "optimizer", "host", "step"}
                    assert all(step[p] >= 0 for p in step), step
                    assert sum(step[p] for p in step if p != "step") == pytest.approx(step["step"], rel=1e-9)
                mean = v["phases_mean_s"]
                assert sum(mean.values()) == pytest.approx(v["step_mean_s"], rel=1e-9)
                assert 0 <= v["hidden_comm_s"] <= mean["backward"]
                assert v["across_ranks_abs_diff"] == 0.0  # every rank trained to the same parameters


def test_the_breakdown_times_the_last_gradient_from_the_first_layer_and_buckets_the_toy_mlp_once(breakdown):
    _, r, _ = breakdown
    first = r["jobs"][0]["result"]["models"]["tiny_mlp"]
    # tiny_mlp's parameters: 0.weight, 0.bias, 2.weight, ...: backward produces the first layer's last
    assert {v["last_gradient"] for v in first["variants"].values()} <= {0, 1}
    assert first["variants"]["hvdkit_bucket"]["bucket_sizes"] == [4 * first["parameters"]]  # < 1 MiB: one bucket


def test_the_breakdown_runs_hvdkits_and_horovods_defaults_and_draws_them(breakdown):
    out, r, stdout = breakdown
    hvdkit, horovod = (job["result"]["horovod_env"] for job in r["jobs"])
    assert (
        hvdkit["HOROVOD_CYCLE_TIME"] == "0.5" and hvdkit["HOROVOD_FUSION_THRESHOLD"] is None
    )  # Gloo's, set by hk.init
    assert horovod["HOROVOD_CYCLE_TIME"] == "1" and horovod["HOROVOD_FUSION_THRESHOLD"] == str(128 << 20)
    assert "| job | model | variant | step ms | forward | backward | exposed_comm |" in stdout
    data = (out / "step_breakdown.png").read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000

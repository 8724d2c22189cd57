"""The torch adapter's contracts on CUDA tensors: 2 real ranks under horovodrun --gloo, NCCL in the engine.

Skipped without a GPU (CI has none; ``make test-gpu`` runs them). With fewer GPUs than ranks the ranks
share them (``hvdkit.core.devices.shared_gpu_env``). One job runs tests/gpu/workers/torch_gpu.py; each
test asserts one contract against a 1-process reference computed in the same job on the same GPU.
"""

import pytest
from gpu_jobs import gpu_or_skip, run_gpu_worker
from helpers import ROOT

WORKER = ROOT / "tests" / "gpu" / "workers" / "torch_gpu.py"
FP32_TOL = 2e-5  # fp32 rounding of a mean taken over two halves instead of the whole batch, 5 steps
FP16_TOL = 2e-3  # averaged gradients rounded to fp16 on the wire (as tests/distributed/test_torch_contracts.py)
AMP_TOL = 5e-3  # fp16 forward passes on half batches vs the whole batch, 20 steps of SGD with momentum
BF16_TOL = 1e-2  # bf16 keeps 8 bits of mantissa: forward passes on half batches may round differently (CPU: 1.7e-4)


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    gpu_or_skip()
    results = run_gpu_worker(WORKER, tmp_path_factory.mktemp("gpu"))
    for r in results:
        errors = {k: v["error"] for k, v in r.items() if isinstance(v, dict) and "error" in v}
        assert not errors, f"rank {r['rank']} failed: {errors}"
    return results


def more(ranks, name):
    """Both ranks' records of one part of the worker's section_more (each part is recorded on its own)."""
    parts = [r["more"][name] for r in ranks]
    for rank, p in enumerate(parts):
        assert "error" not in p, f"rank {rank}: {p['error']}"
    return parts


def test_the_engine_has_nccl_and_each_rank_is_pinned_to_a_gpu(ranks):
    assert all(r["nccl_built"] for r in ranks)
    for r in ranks:
        assert r["device"]["device"].startswith("cuda:"), r["device"]
        assert r["device"]["device"] == f"cuda:{r['device']['current']}"


def test_broadcast_state_lands_rank0s_parameters_on_the_gpu(ranks):
    r0, r1 = (r["contracts"] for r in ranks)
    assert r0["init_digest"] == r1["init_digest"]
    assert r1["init_device"].startswith("cuda")


@pytest.mark.parametrize("variant, tol", [("fp32", FP32_TOL), ("fp16", FP16_TOL)])
def test_ranks_are_bitwise_equal_and_match_one_process_on_the_whole_batch(ranks, variant, tol):
    r0, r1 = (r["contracts"][variant] for r in ranks)
    assert r0["digest"] == r1["digest"]
    assert r0["ref_diff"] <= tol, f"{variant}: {r0['ref_diff']:.3g} from the 1-process run (tolerance {tol})"


def test_fp16_compression_differs_from_fp32_but_within_its_rounding(ranks):
    c = ranks[0]["contracts"]
    assert c["fp16"]["digest"] != c["fp32"]["digest"]  # the fp16 wire really was used


def test_fp16_amp_with_grad_scaler_trains_like_one_process(ranks):
    a0, a1 = (r["amp"] for r in ranks)
    assert a0["digest"] == a1["digest"]
    assert a0["scale"] == a1["scale"] == a0["ref_scale"]  # no rank skipped a step the others took
    assert a0["last_loss"] < a0["first_loss"]
    assert a0["ref_diff"] <= AMP_TOL, f"{a0['ref_diff']:.3g} from the 1-process AMP run (tolerance {AMP_TOL})"


@pytest.mark.parametrize("way", ["gpu_to_cpu", "cpu_to_gpu"])
def test_a_checkpoint_saved_on_one_device_resumes_on_the_other(ranks, way):
    for r in ranks:
        c = r["checkpoint"][way]
        assert c["step"] is not None
        assert c["diff"] == 0.0
        want = "cpu" if way == "gpu_to_cpu" else "cuda"
        assert c["param_device"].startswith(want)
        assert c["state_devices"] and all(d.startswith(want) for d in c["state_devices"])  # momentum with its parameter


def test_metrics_from_cuda_tensors_average_exactly_over_the_union_of_samples(ranks):
    # rank 0: 0, 1, 2; rank 1: 10, 11, 12, 13 -> 49 / 7
    assert [r["metrics"]["mean"] for r in ranks] == [7.0, 7.0]


def test_clipping_after_averaging_on_cuda_matches_one_process_clipping_the_whole_batch(ranks):
    c0, c1 = more(ranks, "clip")
    assert c0["digest"] == c1["digest"]
    assert c0["norm"] == c1["norm"] > 0.05  # the averaged gradient's norm before clipping: it was clipped
    assert c0["ref_diff"] <= FP32_TOL, f"{c0['ref_diff']:.3g} from the 1-process clipped run"


def test_zero1_state_sharding_on_cuda_matches_one_process(ranks):
    z0, z1 = more(ranks, "zero")
    assert z0["digest"] == z1["digest"]
    assert z0["device"].startswith("cuda")
    assert z0["ref_diff"] <= FP32_TOL, f"{z0['ref_diff']:.3g} from the 1-process run"


def test_bf16_autocast_on_cuda_keeps_ranks_equal_and_near_one_process(ranks):
    b0, b1 = more(ranks, "bf16")
    assert b0["digest"] == b1["digest"]
    assert b0["ref_diff"] <= BF16_TOL, f"{b0['ref_diff']:.3g} from the 1-process bf16 run"


def test_auto_compression_on_cuda_picks_one_wire_for_every_rank(ranks):
    a0, a1 = more(ranks, "auto")
    assert a0["chosen"] == a1["chosen"] and a0["chosen"] in ("none", "fp16")
    assert a0["digest"] == a1["digest"]


def test_the_straggler_monitor_names_the_slow_rank_from_cuda_steps(ranks):
    assert [p["straggler"] for p in more(ranks, "straggler")] == [1, 1]  # rank 1 sleeps 0.2 s a step

"""The torch example stopped mid-epoch at 2 ranks, resumed at 1, stopped again, resumed at 2 (plain
mpirun, the deterministic ``--stop-at-step`` stop, which takes the preemption path: every rank stops
after the same step and rank 0 saves it with the epoch's global sample offset).

With the global batch fixed at 64 (32 per rank x 2 ranks x 1 pass, or x 1 rank x 2 passes) and no
compression it must end where an uninterrupted 2-rank run ends, and every training sample must be
used exactly once per epoch. Before the global-offset sampler, the example skipped "batches done"
at the new size: stopping after 10 steps at 2 ranks and resuming at 1 re-trained 320 samples.
"""

import os
from collections import Counter

import pytest
import torch
from helpers import ROOT, last_json_line, read_sample_logs, record_figures, run_example, run_ranks

from hvdkit.core.checkpoint.state import read_newest

pytestmark = [pytest.mark.dist, pytest.mark.timeout(1500)]  # 4-5 jobs in one module fixture
TORCH = str(ROOT / "examples" / "torch_digits.py")
TRAIN_SAMPLES = 1437
STEPS_PER_EPOCH = 23  # 22 steps of 64 and one of 29
COMMON = ["--epochs", "2", "--compression", "none", "--global-batch-size", "64"]
LEGS = ((2, ["--stop-at-step", "10"]), (1, ["--stop-at-step", "30"]), (2, []))  # 10: epoch 1, 30: epoch 2


def run(np_, ckpt, samples, *extra):
    argv = [TORCH, *COMMON, "--checkpoint-dir", str(ckpt), "--sample-log", str(samples), *extra]
    return run_example(np_, argv)


def final_line(proc):
    return last_json_line(proc.stdout)


def newest_params(ckpt):
    """The model tensors of the newest checkpoint in ``ckpt``, by state-dict key (the public reader)."""
    return {k: torch.from_numpy(a) for k, a in read_newest(ckpt).state["model"].items()}


@pytest.fixture(scope="module")
def jobs(tmp_path_factory):
    d = tmp_path_factory.mktemp("world-size-torch")
    reference = run(2, d / "ref", d / "ref-samples")
    legs = [run(np_, d / "elastic", d / "elastic-samples", *extra) for np_, extra in LEGS]
    return {"dir": d, "reference": reference, "legs": legs}


def test_stopping_at_2_ranks_resuming_at_1_then_at_2_ends_within_1e_5_of_an_uninterrupted_run(jobs):
    d = jobs["dir"]
    assert [final_line(p)["preempted"] for p in jobs["legs"]] == [True, True, False]
    assert [final_line(p)["steps"] for p in jobs["legs"]] == [10, 30, 2 * STEPS_PER_EPOCH]
    assert final_line(jobs["reference"])["steps"] == 2 * STEPS_PER_EPOCH
    ref, got = newest_params(d / "ref"), newest_params(d / "elastic")
    diff = max((ref[k] - got[k]).abs().max().item() for k in ref)
    record_figures("world_size_change_torch_2_1_2", max_abs_param_diff=diff, steps=2 * STEPS_PER_EPOCH)
    assert diff < 1e-5, f"final parameters differ by {diff}"
    assert any((ref[k] != 0).any() for k in ref)  # a real model, not an empty comparison


def test_every_training_sample_is_used_exactly_once_per_epoch_across_the_changes(jobs):
    d = jobs["dir"]
    for prefix in ("ref-samples", "elastic-samples"):
        lines = read_sample_logs(d / prefix)
        for epoch in (0, 1):
            used = Counter(i for line in lines if line["epoch"] == epoch for i in line["indices"])
            assert sorted(used) == list(range(TRAIN_SAMPLES)), prefix
            assert set(used.values()) == {1}, (
                f"{prefix} epoch {epoch}: repeated {[i for i, c in used.items() if c > 1][:10]}"
            )
    sizes = {(line["step"], line["size"]) for line in read_sample_logs(d / "elastic-samples")}
    assert {size for step, size in sizes if step <= 10} == {2}
    assert {size for step, size in sizes if 10 < step <= 30} == {1}
    assert {size for step, size in sizes if step > 30} == {2}


def test_every_step_trains_on_the_same_samples_as_in_the_uninterrupted_run(jobs):
    def by_step(prefix):
        steps = {}
        for line in read_sample_logs(jobs["dir"] / prefix):
            steps.setdefault(line["step"], []).extend(line["indices"])
        return {step: sorted(indices) for step, indices in steps.items()}

    ref, got = by_step("ref-samples"), by_step("elastic-samples")
    assert sorted(got) == list(range(1, 2 * STEPS_PER_EPOCH + 1))
    assert got == ref
    assert {len(v) for v in ref.values()} == {64, TRAIN_SAMPLES - 22 * 64}


def test_rank_0_logs_the_global_batch_plan_and_the_reseeding_at_each_world_size(jobs):
    two, one, again = (p.stderr + p.stdout for p in jobs["legs"])
    assert "world size 2: global batch 64 = 32 per rank x 2 ranks x 1 accumulation step" in two
    assert "world size 1: global batch 64 = 32 per rank x 1 rank x 2 accumulation steps" in one
    assert (
        "checkpoint was written by 2 ranks, this job has 1" in one
        and "RNG states re-seeded from (seed 0, step 10" in one
    )
    assert "checkpoint was written by 1 ranks, this job has 2" in again and "step 30" in again


def test_a_global_batch_that_does_not_divide_fails_on_every_rank_and_leaves_the_checkpoints(jobs):
    ckpt = jobs["dir"] / "elastic"
    before = {p: sorted(os.listdir(ckpt / p)) for p in os.listdir(ckpt) if p.startswith("ckpt-")}
    argv = [TORCH, *COMMON, "--checkpoint-dir", str(ckpt), "--global-batch-size", "96"]  # 96 / (32 x 2) = 1.5
    proc = run_ranks("mpirun", 2, argv, timeout=600)
    assert proc.returncode != 0
    message = "torch_digits: error: global_batch_size=96 cannot be split into batch_size=32 per rank x 2 ranks"
    assert proc.stderr.count(message) == 2, proc.stderr[-3000:]  # every rank says it
    assert "use a per-rank batch_size of 24 or 16 or 12, or a global_batch_size that is a multiple of 64" in proc.stderr
    assert {p: sorted(os.listdir(ckpt / p)) for p in os.listdir(ckpt) if p.startswith("ckpt-")} == before

"""The Keras example (``model.fit``) trained 1 epoch at 2 ranks, 1 more at 1 rank, (with a schedule) the last
at 2 (plain mpirun; each leg ends at an epoch boundary, where ``fit`` resumes).

With the global batch fixed at 64 (32 per rank x 2 ranks, or x 1 rank x 2 accumulation steps,
Keras's own ``gradient_accumulation_steps``) and no compression it must end where an uninterrupted
2-rank run ends, every training sample used exactly once per epoch, and the optimizer's step count
must carry over although Keras counts batches, not steps, when it accumulates. Both with a constant
rate and with a schedule (``--lr-decay``: ExponentialDecay over optimizer steps): Keras 3.15 alone
evaluated the schedule at the batch count, twice as fast in the 1-rank leg (accumulation 2), and the
run ended elsewhere.
"""

from collections import Counter

import numpy as np
import pytest
from helpers import ROOT, last_json_line, read_sample_logs, record_figures, run_example

from hvdkit.core.checkpoint.state import read_newest

pytestmark = [pytest.mark.dist, pytest.mark.timeout(1500)]  # 4-5 jobs in one module fixture
KERAS = str(ROOT / "examples" / "keras_digits.py")
TRAIN_SAMPLES = 1437
STEPS_PER_EPOCH = 23
COMMON = ["--compression", "none", "--global-batch-size", "64"]
# (ranks, epochs to reach). With a constant rate 2 -> 1 only: what a resume at another size does to a constant
# rate is the same rule both ways, checked for any sequence of sizes in
# tests/unit/keras/test_lr_world_size_changes_keras.py; the schedule's legs go back to 2 ranks as well.
LEGS = {"constant-lr": ((2, 1), (1, 2)), "lr-decay": ((2, 1), (1, 2), (2, 3))}


def run(np_, epochs, ckpt, samples, *extra):
    argv = [
        KERAS,
        *COMMON,
        "--epochs",
        str(epochs),
        "--checkpoint-dir",
        str(ckpt),
        "--sample-log",
        str(samples),
        *extra,
    ]
    return run_example(np_, argv)


def final_line(proc):
    return last_json_line(proc.stdout)


def newest_params(ckpt):
    """The model weights of the newest checkpoint in ``ckpt``, by position (the public reader)."""
    return {f"model/{i}": a for i, a in enumerate(read_newest(ckpt).state["model"])}


@pytest.fixture(scope="module", params=[None, "0.7"], ids=list(LEGS))
def jobs(request, tmp_path_factory):
    d = tmp_path_factory.mktemp("world-size-keras")
    decay = [] if request.param is None else ["--lr-decay", request.param]
    plan = LEGS["constant-lr" if request.param is None else "lr-decay"]
    reference = run(2, plan[-1][1], d / "ref", d / "ref-samples", *decay)
    legs = [run(np_, epochs, d / "elastic", d / "elastic-samples", *decay) for np_, epochs in plan]
    return {"dir": d, "reference": reference, "legs": legs, "plan": plan, "schedule": request.param is not None}


def test_fit_resumed_at_other_sizes_ends_within_1e_5_of_an_uninterrupted_run(jobs):
    d, epochs = jobs["dir"], [e for _, e in jobs["plan"]]
    assert [final_line(p)["steps"] for p in jobs["legs"]] == [e * STEPS_PER_EPOCH for e in epochs]
    assert [final_line(p)["resumed_from_epoch"] for p in jobs["legs"]] == [e - 1 for e in epochs]
    ref, got = newest_params(d / "ref"), newest_params(d / "elastic")
    assert sorted(ref) == sorted(got)
    diff = max(float(np.max(np.abs(ref[k] - got[k]))) for k in ref)
    record_figures(
        "world_size_change_keras_"
        + "_".join(str(n) for n, _ in jobs["plan"])
        + ("_lr_decay" if jobs["schedule"] else ""),
        max_abs_param_diff=diff,
        epochs=len(epochs),
    )
    assert diff < 1e-5, f"final parameters differ by {diff}"


def test_every_training_sample_is_used_exactly_once_per_epoch_across_the_changes(jobs):
    d = jobs["dir"]
    for prefix in ("ref-samples", "elastic-samples"):
        lines = read_sample_logs(d / prefix)
        for epoch in range(len(jobs["plan"])):
            used = Counter(i for line in lines if line["epoch"] == epoch for i in line["indices"])
            assert sorted(used) == list(range(TRAIN_SAMPLES)), f"{prefix} epoch {epoch}"
            assert set(used.values()) == {1}, f"{prefix} epoch {epoch}"
    sizes = {line["epoch"]: line["size"] for line in read_sample_logs(d / "elastic-samples")}
    assert sizes == {epoch: n for epoch, (n, _) in enumerate(jobs["plan"])}

    def by_step(prefix):
        steps = {}
        for line in read_sample_logs(d / prefix):
            steps.setdefault(line["step"], []).extend(line["indices"])
        return {step: sorted(v) for step, v in steps.items()}

    assert by_step("elastic-samples") == by_step("ref-samples")  # the same samples in every optimizer step


def test_rank_0_logs_the_plan_and_the_resume_at_another_size(jobs):
    one, *again = (p.stderr + p.stdout for p in jobs["legs"][1:])
    assert "world size 1: global batch 64 = 32 per rank x 1 rank x 2 accumulation steps" in one
    assert "checkpoint was written by 2 ranks, this job has 1: resuming at epoch 1" in one
    # a constant rate is reset to what the script set for this size; a schedule follows the step count
    assert ("learning rate 0.05 as configured for this size" in one) is not jobs["schedule"]
    assert all("checkpoint was written by 1 ranks, this job has 2: resuming at epoch 2" in a for a in again)

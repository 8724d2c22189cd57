"""``hvdkit.torch.Trainer`` on real ranks (workers/trainer_torch.py: the example's model, optimizer and
cosine schedule on the digits data, compression "none").

- It trains exactly like the manual loop of examples/torch_digits_loop.py: the final parameters are
  bitwise equal (under mpirun; the Trainer runs over Gloo in the in-process recovery tests).
- Killed with SIGKILL mid-epoch (after a step-5 checkpoint) and restarted by ``hvdkit run
  --max-restarts 1``, it ends bitwise equal to the uninterrupted run, with the same history; the launcher
  says it restarted, and no rank of the job is left.
- Preempted (SIGTERM) at 2 ranks, resumed at 1, preempted again, resumed at 2, with a global batch
  of 64, it ends within 1e-5 of the uninterrupted run (1 rank accumulates 2 micro-batches: other rounding).
- Validation over 359 samples (179 and 180 per rank) equals the one-process value over the set.
- fp16 (GradScaler) and bf16 forward passes run in that precision and train.
- Bad options fail on every rank with the message, before any collective.
- tracking=, progress=True and straggler_threshold= do what the rest of hvdkit does: rank 0 alone
  writes the TensorBoard file (the history's values) and shows progress; every rank gets the
  straggler report; on_train_batch_end sees every step with its loss and learning rate.
- shard_optimizer_state=True (ZeRO-1) ends within fp32 rounding of the unsharded run with half the
  optimizer state per rank, checkpoints the unsharded state, and resumes from SIGTERM bitwise at 2 ranks
  and within fp32 rounding at 1.
"""

import json
import os
import shutil

import psutil
import pytest
import torch
from helpers import HVDKIT, PYTHON, ROOT, hvdkit_run, run_bounded, run_ranks

from hvdkit.core.checkpoint.state import read_newest

pytest.importorskip("tensorboard")
import tensorboard.compat  # noqa: E402
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator  # noqa: E402

# TensorBoard reads records with TensorFlow's reader when TensorFlow is installed; importing it sets
# environment variables, so do it at collection, not inside a test (the conftest's leak check).
assert tensorboard.compat.tf.__version__

pytestmark = [pytest.mark.dist, pytest.mark.timeout(1500)]
WORKER = str(ROOT / "tests" / "distributed" / "workers" / "trainer_torch.py")
EXAMPLE = str(ROOT / "examples" / "torch_digits_loop.py")
STEPS = 46  # 2 epochs of 23 steps (22 of 64 samples and one of 29)


def params(ckpt):
    """The model tensors of the newest checkpoint in ``ckpt``, by state-dict key."""
    return {k: torch.from_numpy(a) for k, a in read_newest(ckpt).state["model"].items()}


def bitwise_equal(a, b):
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def max_diff(a, b):
    return max((a[k] - b[k]).abs().max().item() for k in a)


def ranks_of(out, np_=2):
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(np_)]


def trainer(launcher, np_, out, *args, ok=True):
    out.mkdir(exist_ok=True)
    proc = run_ranks(launcher, np_, [WORKER, str(out), *args], timeout=600)
    if ok:
        assert proc.returncode == 0, f"{launcher} job failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
    return proc


@pytest.fixture(scope="module")
def equivalence(tmp_path_factory):
    """The manual loop (the example) and the Trainer, same seed and options, under mpirun. Once: both run over the
    same controller, which cannot make them differ (the Trainer trains over Gloo in test_in_process_recovery.py)."""
    d = tmp_path_factory.mktemp("trainer-mpirun")
    example = [EXAMPLE, "--epochs", "2", "--compression", "none", "--checkpoint-dir", str(d / "manual")]
    proc = run_ranks("mpirun", 2, example, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    trainer("mpirun", 2, d / "out", "--checkpoint-dir", str(d / "trainer"), "--val-size", "359")
    return d


def test_the_trainer_ends_bitwise_equal_to_the_manual_loop_of_the_example(equivalence):
    manual, got = params(equivalence / "manual"), params(equivalence / "trainer")
    assert read_newest(equivalence / "trainer").step == read_newest(equivalence / "manual").step == STEPS
    assert bitwise_equal(manual, got), f"max difference {max_diff(manual, got)}"
    assert any((t != 0).any() for t in got.values())


def test_the_history_has_every_metric_per_epoch_identical_on_every_rank(equivalence):
    r0, r1 = ranks_of(equivalence / "out")
    assert r0["history"] == r1["history"]  # epoch_time too: the mean over ranks, on each
    assert list(r0["history"]) == ["loss", "accuracy", "val_loss", "val_accuracy", "lr", "epoch_time"]
    assert all(len(v) == 2 for v in r0["history"].values()) and r0["epoch"] == [0, 1]
    assert r0["history"]["lr"] == [0.05, 0.025]  # cosine over 2 epochs, stepped per epoch
    assert r0["history"]["loss"][1] < r0["history"]["loss"][0]
    assert (r0["resumed_from_epoch"], r0["step"], r0["stopped"]) == (0, STEPS, False)


def test_validation_over_uneven_shards_equals_the_one_process_value_over_the_whole_set(equivalence):
    for r in ranks_of(equivalence / "out"):
        full = r["full_val"]  # 359 samples: 180 on rank 0, 179 on rank 1
        assert abs(r["history"]["val_loss"][-1] - full["val_loss"]) < 1e-6
        assert abs(r["history"]["val_accuracy"][-1] - full["val_accuracy"]) < 1e-6


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """An uninterrupted 2-rank run under mpirun."""
    d = tmp_path_factory.mktemp("trainer-reference")
    trainer("mpirun", 2, d / "out", "--checkpoint-dir", str(d / "ckpt"), "--global-batch-size", "64")
    return d


def test_a_run_killed_mid_epoch_and_restarted_ends_bitwise_equal_to_an_uninterrupted_run(reference, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    args = ["--checkpoint-dir", str(tmp_path / "ckpt"), "--checkpoint-every", "5", "--global-batch-size", "64"]
    kill = ["--signal-at", "8", "--kill", "--once", str(tmp_path / "killed")]  # rank 0, in step 8
    proc = hvdkit_run("-np", "2", "--max-restarts", "1", "--", PYTHON, WORKER, str(out), *args, *kill, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    output = proc.stdout + proc.stderr
    assert "rank 0 was killed by SIGKILL" in output and "resumed from" in output and "(step 5, epoch 0)" in output
    # the launcher's side (the one restart-after-SIGKILL of a torch job in the suite; Keras: test_fault_tolerance)
    assert "restarting (1/1)" in proc.stderr and "job finished after 1 restart used" in proc.stderr
    assert not [p for p in psutil.process_iter(["cmdline"]) if str(out) in " ".join(p.info["cmdline"] or [])]
    ref, got = params(reference / "ckpt"), params(tmp_path / "ckpt")
    assert bitwise_equal(ref, got), f"max difference {max_diff(ref, got)}"
    r0 = ranks_of(out)[0]
    assert (r0["resumed_from_epoch"], r0["step"], r0["stopped"]) == (0, STEPS, False)
    expected = ranks_of(reference / "out")[0]["history"]
    for name in ("loss", "accuracy", "val_loss", "val_accuracy", "lr"):  # the stopped part's totals carried over
        assert r0["history"][name] == pytest.approx(expected[name], rel=1e-12, abs=1e-12), name


def test_preempted_at_2_ranks_resumed_at_1_then_at_2_keeps_the_global_batch(reference, tmp_path):
    common = ["--checkpoint-dir", str(tmp_path / "ckpt"), "--global-batch-size", "64"]
    legs = [(2, ["--signal-at", "10"]), (1, ["--signal-at", "40"]), (2, [])]  # SIGTERM: after step 10, step 30
    results, outputs = [], []
    for i, (np_, extra) in enumerate(legs):
        proc = trainer("mpirun", np_, tmp_path / f"leg{i}", *common, *extra)
        results.append(ranks_of(tmp_path / f"leg{i}", np_)[0])
        outputs.append(proc.stdout + proc.stderr)
    assert [(r["size"], r["step"], r["stopped"]) for r in results] == [(2, 10, True), (1, 30, True), (2, STEPS, False)]
    assert [r["resumed_from_epoch"] for r in results] == [0, 0, 1]
    assert "global batch 64 = 32 per rank x 1 rank x 2 accumulation steps" in outputs[1]
    assert "stopped in epoch 1 after step 10: checkpoint saved" in outputs[0]
    ref, got = params(reference / "ckpt"), params(tmp_path / "ckpt")
    diff = max_diff(ref, got)
    assert diff < 1e-5, f"final parameters differ by {diff}"
    assert results[2]["history"]["val_loss"] == pytest.approx(
        ranks_of(reference / "out")[0]["history"]["val_loss"][1:], rel=1e-4
    )


def test_a_loader_the_user_shards_trains_like_the_dataset_and_a_callback_on_one_rank_stops_every_rank(
    reference, tmp_path
):
    # hk.train_loader's loader is an iterable of this rank's batches with set_epoch: the Trainer does not
    # shard it again, and must train exactly as on the Dataset. Rank 1's callback alone asks to stop.
    trainer("mpirun", 2, tmp_path, "--iterable", "--stop-on-rank1", "0", "--checkpoint-dir", str(tmp_path / "c"))
    r0, r1 = ranks_of(tmp_path)
    assert (r0["epoch"], r1["epoch"], r0["step"]) == ([0], [0], STEPS // 2)  # epochs=2, stopped after the first
    names = ["accuracy", "epoch_time", "loss", "lr", "val_accuracy", "val_loss"]
    assert r0["callback"] == r1["callback"] == [[0, names], ["end", [0]]]
    first_epoch = tmp_path / "reference-epoch-1"
    shutil.copytree(reference / "ckpt" / f"ckpt-{STEPS // 2:012d}", first_epoch / f"ckpt-{STEPS // 2:012d}")
    ref, got = params(first_epoch), params(tmp_path / "c")
    assert bitwise_equal(ref, got), f"max difference {max_diff(ref, got)}"


@pytest.mark.parametrize(("precision", "dtype"), [("fp16", "torch.float16"), ("bf16", "torch.bfloat16")])
def test_mixed_precision_runs_its_forward_pass_in_that_dtype_and_trains(precision, dtype, tmp_path, reference):
    trainer("mpirun", 2, tmp_path, "--precision", precision, "--epochs", "3", "--checkpoint-dir", str(tmp_path / "c"))
    r0, r1 = ranks_of(tmp_path)
    assert r0["output_dtypes"] == [dtype]
    losses = r0["history"]["loss"]
    assert losses[2] < losses[1] < losses[0] and r0["history"]["val_loss"][2] < r0["history"]["val_loss"][0]
    assert r0["history"] == r1["history"]
    assert (r0["loss_scale"] is not None) == (precision == "fp16")  # fp16 steps through a GradScaler
    assert not bitwise_equal(params(tmp_path / "c"), params(reference / "ckpt"))  # not the fp32 arithmetic


# One option whose check needs the job's size; the checks of the others (precision="fp8", ...) are the same code
# on one rank or two, and tests/unit/torch/test_trainer.py runs them.
@pytest.mark.parametrize(
    ("args", "message"),
    [(["--global-batch-size", "96"], "global_batch_size=96 cannot be split into batch_size=32 per rank x 2 ranks")],
)
def test_a_bad_option_fails_on_every_rank_with_its_message_and_never_hangs(args, message, tmp_path):
    proc = trainer("mpirun", 2, tmp_path, *args, ok=False)
    assert proc.returncode != 0
    assert proc.stderr.count(message) == 2, proc.stderr[-3000:]  # every rank says it


def test_tracking_progress_straggler_report_and_step_callbacks_on_real_ranks(tmp_path):
    argv = [HVDKIT, "run", "-np", "2", "--", PYTHON, WORKER, str(tmp_path), "--tracking", str(tmp_path / "runs")]
    argv += ["--progress", "--straggler-threshold", "50", "--step-logs"]
    proc = run_bounded(argv, 600, env={"HVDKIT_PROGRESS": "1", "HVDKIT_PROGRESS_INTERVAL": "0.001"})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    r0, r1 = ranks_of(tmp_path)
    events = os.listdir(tmp_path / "runs")
    assert len(events) == 1 and "tfevents" in events[0], events  # rank 0's file only
    tb = EventAccumulator(str(tmp_path / "runs"))
    tb.Reload()
    for tag in ("loss", "accuracy", "val_loss", "val_accuracy", "lr", "epoch_time"):
        got = [(e.step, e.value) for e in tb.Scalars(tag)]
        assert got == [(i, pytest.approx(v, rel=1e-6)) for i, v in enumerate(r0["history"][tag])], tag
    lines = (proc.stdout + proc.stderr).splitlines()
    bars = [line for line in lines if "epoch 1/2 [" in line and "samples/s" in line]
    assert bars and all(line.startswith("[rank 0]") for line in bars), bars[:3]  # rank 0's bar only
    assert any(line.startswith("[rank 0] epoch 2/2 [") and f"{STEPS // 2}/{STEPS // 2} 100%" in line for line in lines)
    for r in (r0, r1):  # the same report on every rank: both ranks timed every step of the last epoch
        assert [t["steps"] for t in r["straggler"]["ranks"]] == [STEPS // 2] * 2 and r["straggler"]["epoch"] == 1
        assert [s for s, _ in r["step_logs"]] == list(range(1, STEPS + 1))
    assert r0["step_logs"][0][1]["lr"] == 0.05 and r0["step_logs"][-1][1]["lr"] == pytest.approx(
        r0["history"]["lr"][-1]
    )
    assert r0["step_logs"][0][1]["loss"] != r1["step_logs"][0][1]["loss"]  # each rank's own samples


def test_a_loader_the_user_shards_resumes_mid_epoch_at_its_size_bitwise_and_refuses_another_size(reference, tmp_path):
    # A SIGTERM in epoch 2 checkpoints how many of this rank's batches were done; the next start skips
    # them. At another world size the user's shards would differ: every rank refuses, naming the size.
    common = ["--iterable", "--checkpoint-dir", str(tmp_path / "ckpt")]
    trainer("mpirun", 2, tmp_path / "leg0", *common, "--signal-at", "30")  # rank 0's 30th batch: step 30
    assert [(r["step"], r["stopped"]) for r in ranks_of(tmp_path / "leg0")] == [(30, True)] * 2
    proc = trainer("mpirun", 1, tmp_path / "other-size", *common, ok=False)
    assert proc.returncode != 0
    assert "the checkpoint stopped mid-epoch at 2 ranks over batches this script shards itself" in proc.stderr
    trainer("mpirun", 2, tmp_path / "leg1", *common)
    r0 = ranks_of(tmp_path / "leg1")[0]
    assert (r0["resumed_from_epoch"], r0["step"], r0["stopped"]) == (1, STEPS, False)
    ref, got = params(reference / "ckpt"), params(tmp_path / "ckpt")
    assert bitwise_equal(ref, got), f"max difference {max_diff(ref, got)}"
    assert r0["history"]["val_loss"] == ranks_of(reference / "out")[0]["history"]["val_loss"][1:]


@pytest.fixture(scope="module")
def sharded(tmp_path_factory):
    """The reference run with shard_optimizer_state=True (ZeRO-1), uninterrupted, 2 ranks under mpirun."""
    d = tmp_path_factory.mktemp("trainer-sharded")
    trainer("mpirun", 2, d / "out", "--checkpoint-dir", str(d / "ckpt"), "--global-batch-size", "64", "--shard")
    return d


def optimizer_state(ckpt):
    """The momentum buffers of the newest checkpoint in ``ckpt``, by parameter index."""
    return {i: torch.from_numpy(s["momentum_buffer"]) for i, s in read_newest(ckpt).state["optimizer"]["state"].items()}


def test_a_sharded_trainer_ends_within_fp32_rounding_of_the_unsharded_one_with_half_the_state(reference, sharded):
    ref, got = params(reference / "ckpt"), params(sharded / "ckpt")
    assert read_newest(sharded / "ckpt").step == STEPS
    for k in ref:  # 46 steps of SGD with momentum: only the order of the gradient sums differs
        rel = ((got[k] - ref[k]).abs() / ref[k].abs().clamp(min=1e-3)).max().item()
        assert rel < 1e-5, f"{k}: relative difference {rel}"
    assert not all(torch.equal(ref[k], torch.zeros_like(ref[k])) for k in ref)
    # the checkpoint holds the whole unsharded optimizer state (gathered to rank 0), equal to the unsharded run's
    ref_state, got_state = optimizer_state(reference / "ckpt"), optimizer_state(sharded / "ckpt")
    assert sorted(got_state) == sorted(ref_state) and len(ref_state) == 6
    for i in ref_state:
        assert got_state[i].shape == ref_state[i].shape
        assert (got_state[i] - ref_state[i]).abs().max().item() < 1e-5
    r0, r1 = ranks_of(sharded / "out")
    plain = ranks_of(reference / "out")[0]
    assert r0["optimizer"] == r1["optimizer"] == "ShardedOptimizer" and plain["optimizer"] != "ShardedOptimizer"
    total = sum(t.numel() for t in ref.values())  # 17,226 parameters: one momentum element each unsharded
    assert plain["state_elements"] == total
    assert r0["state_elements"] + r1["state_elements"] == total
    assert max(r0["state_elements"], r1["state_elements"]) <= total // 2 + 3
    assert r0["history"] == r1["history"]
    assert r0["history"]["val_loss"] == pytest.approx(plain["history"]["val_loss"], rel=1e-5)


def test_a_sharded_trainer_preempted_resumes_at_2_ranks_bitwise_and_at_1_rank_within_fp32_rounding(sharded, tmp_path):
    # 2 ranks, SIGTERM after step 10; 2 ranks resume (bitwise the uninterrupted sharded run, step 10 -> 46)
    common = ["--global-batch-size", "64", "--shard"]
    same, other = tmp_path / "same", tmp_path / "other"
    same.mkdir()
    trainer("mpirun", 2, same / "leg0", "--checkpoint-dir", str(same / "ckpt"), *common, "--signal-at", "10")
    trainer("mpirun", 2, same / "leg1", "--checkpoint-dir", str(same / "ckpt"), *common)
    first, second = ranks_of(same / "leg0")[0], ranks_of(same / "leg1")[0]
    assert (first["step"], first["stopped"], second["step"], second["stopped"]) == (10, True, STEPS, False)
    ref, got = params(sharded / "ckpt"), params(same / "ckpt")
    assert bitwise_equal(ref, got), f"max difference {max_diff(ref, got)}"
    # the same checkpoint of step 10 resumed sharded at 1 rank (2 accumulation steps): fp32 rounding apart
    shutil.copytree(same / "ckpt" / f"ckpt-{10:012d}", other / "ckpt" / f"ckpt-{10:012d}")
    trainer("mpirun", 1, other / "leg1", "--checkpoint-dir", str(other / "ckpt"), *common)
    assert ranks_of(other / "leg1", 1)[0]["step"] == STEPS
    diff = max_diff(ref, params(other / "ckpt"))
    assert diff < 1e-5, f"final parameters differ by {diff}"


def test_a_sharded_trainer_in_fp16_steps_through_the_loss_scaler_as_the_unsharded_one(tmp_path):
    runs = {}
    for name, extra in (("plain", []), ("sharded", ["--shard"])):
        d = tmp_path / name
        trainer("mpirun", 2, d, "--precision", "fp16", "--checkpoint-dir", str(d / "c"), *extra)
        runs[name] = (ranks_of(d), params(d / "c"))
    (p0, _), ref = runs["plain"]
    (s0, s1), got = runs["sharded"]
    assert s0["optimizer"] == "ShardedOptimizer" and s0["output_dtypes"] == ["torch.float16"]
    assert s0["loss_scale"] == s1["loss_scale"] == p0["loss_scale"]
    assert s0["history"] == s1["history"]
    assert s0["history"]["loss"][1] < s0["history"]["loss"][0]
    for k in ref:
        rel = ((got[k] - ref[k]).abs() / ref[k].abs().clamp(min=1e-3)).max().item()
        assert rel < 1e-5, f"{k}: relative difference {rel}"

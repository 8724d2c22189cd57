"""``hvdkit.torch.Trainer`` in one process: its arguments are refused before anything starts (no
Horovod, no collective: every rank raises the same error), and its History, callbacks and
checkpointed learning state behave as documented. The training itself runs on real ranks in
tests/distributed/test_trainer_torch.py."""

import json
import subprocess

import pytest
from helpers import PYTHON, ROOT

torch = pytest.importorskip("torch")

import hvdkit.torch as hk  # noqa: E402
from hvdkit.core import ConfigError  # noqa: E402
from hvdkit.torch.trainer_parts import History, LearningState, call_callbacks, check_callbacks  # noqa: E402

# torch's first optimizer step sets TORCHINDUCTOR_CACHE_DIR: take it at import, not inside a test
# (the conftest fails a test that changes the environment).
torch.optim.SGD(torch.nn.Linear(1, 1).parameters(), lr=0.1).step()


def parts():
    model = torch.nn.Linear(4, 2)
    return model, torch.optim.SGD(model.parameters(), lr=0.1), torch.nn.functional.cross_entropy


def make(**options):
    model, opt, loss = parts()
    options.setdefault("batch_size", 8)
    return hk.Trainer(model, opt, loss, **options)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"batch_size": 0}, "batch_size must be an integer >= 1 (got 0); the per-rank batch size"),
        ({"global_batch_size": -64}, "global_batch_size must be an integer >= 1 (got -64)"),
        ({"precision": "fp8"}, "precision must be one of ('fp32', 'bf16', 'fp16') (got 'fp8')"),
        ({"compression": "gzip"}, "compression must be one of 'none', 'fp16', 'auto' (got 'gzip')"),
        ({"checkpoint_every": "step"}, "checkpoint_every must be an integer >= 1 (got 'step'); pass 'epoch'"),
        ({"checkpoint_every": 0}, "checkpoint_every must be an integer >= 1 (got 0)"),
        ({"keep": 0}, "keep must be an integer >= 1 (got 0)"),
        ({"max_grad_norm": -1.0}, "max_grad_norm must be a finite number > 0 (got -1.0); or None"),
        ({"lr_rule": "cubic"}, "lr_rule must be one of ('linear', 'sqrt', 'none') (got 'cubic')"),
        ({"lr_rule": "linear", "global_batch_size": 64}, "use lr_rule='none' with a global batch"),
        ({"warmup_steps": -5}, "warmup_steps must be an integer >= 0 (got -5)"),
        ({"metrics": ["accuracy"]}, "metrics must map a name to fn(output, target) -> tensor (got list)"),
        ({"metrics": {"loss": len}}, "metric name 'loss' is not usable"),
        ({"metrics": {"val_acc": len}}, "metric name 'val_acc' is not usable"),
        ({"metrics": {"acc": 3}}, "metrics['acc'] must be callable as fn(output, target) (got int)"),
        (
            {"callbacks": [object()]},
            "has none of the methods on_train_begin, on_train_batch_end, on_epoch_end, on_train_end",
        ),
        ({"callbacks": 5}, "callbacks must be a list of objects (got int)"),
        ({"scheduler_interval": "batch"}, "scheduler_interval must be one of ('epoch', 'step') (got 'batch')"),
        ({"tracking": 42}, "tracking must be None, a log directory or an hk.Tracker (got int)"),
        ({"straggler_threshold": 0.5}, "straggler_threshold must be a finite number > 1 (got 0.5)"),
        ({"seed": -1}, "seed must be an integer >= 0 (got -1)"),
        ({"shard_optimizer_state": 1}, "shard_optimizer_state must be True or False (got 1)"),
    ],
)
def test_a_bad_option_is_a_config_error_naming_the_value_before_anything_starts(options, message):
    with pytest.raises(ConfigError) as e:
        make(**options)
    assert message in str(e.value)


def test_a_scheduler_object_is_refused_with_the_factory_form_as_the_fix():
    model, opt, loss = parts()
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1)
    with pytest.raises(ConfigError, match=r"scheduler=lambda opt: torch.optim.lr_scheduler.CosineAnnealingLR"):
        hk.Trainer(model, opt, loss, batch_size=8, scheduler=sched)


def test_model_optimizer_and_loss_of_the_wrong_kind_are_refused():
    model, opt, loss = parts()
    with pytest.raises(ConfigError, match="model must be a torch.nn.Module"):
        hk.Trainer(lambda x: x, opt, loss, batch_size=8)
    with pytest.raises(ConfigError, match=r"optimizer must be a torch.optim.Optimizer \(got list\)"):
        hk.Trainer(model, [opt], loss, batch_size=8)
    with pytest.raises(ConfigError, match=r"loss_fn must be callable"):
        hk.Trainer(model, opt, "mse", batch_size=8)


def test_an_optimizer_that_is_already_distributed_is_refused():
    model, opt, loss = parts()
    opt.skip_synchronize = lambda: None  # what hk.DistributedOptimizer's (Horovod's) class has
    with pytest.raises(ConfigError, match="optimizer is already distributed"):
        hk.Trainer(model, opt, loss, batch_size=8)


def test_a_sharded_trainer_refuses_an_optimizer_it_cannot_shard_before_anything_starts():
    model, _, loss = parts()
    lbfgs = torch.optim.LBFGS(model.parameters())
    with pytest.raises(ConfigError, match=r"cannot shard LBFGS.*shard_optimizer_state=False"):
        hk.Trainer(model, lbfgs, loss, batch_size=8, shard_optimizer_state=True)


# One process, no launcher (size 1), in a child process: Horovod started here would stay started for
# every later test of this session, and set its variables (the conftest's leak check).
SMALL_DATASET = """
import json, torch, hvdkit.torch as hk
from hvdkit.core import ConfigError
data = torch.utils.data.TensorDataset(torch.randn(5, 4), torch.randint(0, 2, (5,)))
def make(**options):
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    return hk.Trainer(model, opt, torch.nn.functional.cross_entropy, compression="none", progress=False, **options)
def fit(trainer):
    try:
        return trainer.fit(data, epochs=1).step
    except ConfigError as e:
        return str(e)
out = {}
trainer = make(batch_size=8, drop_last=True)
before = [p.detach().clone() for p in trainer.model.parameters()]
out["drop_last"] = fit(trainer)
out["options"] = [type(trainer.options).__name__, trainer.options.batch_size, trainer.options.checkpoint_every]
try:
    trainer.options.batch_size = 16
except AttributeError as e:  # dataclasses.FrozenInstanceError
    out["options"].append(type(e).__name__)
out["unchanged"] = all(torch.equal(a, b) for a, b in zip(before, trainer.model.parameters()))
out["global_batch"] = fit(make(batch_size=8, global_batch_size=16, drop_last=True))
out["keep_last"] = fit(make(batch_size=8))
print(json.dumps(out))
"""


def test_a_dataset_smaller_than_one_global_batch_with_drop_last_is_refused_before_any_step():
    # it trained 0 steps without a word (loss nan, weights unchanged; a `hvdkit tune` trial "completed")
    proc = subprocess.run([PYTHON, "-c", SMALL_DATASET], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.splitlines()[-1])
    assert out["drop_last"] == (
        "train_data has 5 samples, fewer than one global batch of 8 (world size 1: global batch 8 = 8 per rank x "
        "1 rank x 1 accumulation step (no global_batch_size given: it changes with the world size)), and "
        "drop_last=True drops that incomplete batch: fit() would train 0 steps. Pass drop_last=False (the smaller "
        "last step trains too), a smaller batch_size, or more samples"
    )
    assert out["unchanged"]
    # the checked options, frozen: the loop reads what the constructor checked
    assert out["options"] == ["TrainerOptions", 8, None, "FrozenInstanceError"]
    assert out["global_batch"].startswith("train_data has 5 samples, fewer than one global batch of 16 (")
    assert out["global_batch"].endswith("a smaller batch_size or global_batch_size, or more samples")
    assert out["keep_last"] == 1  # without drop_last the 5 samples make one (smaller) step


def test_batch_size_is_keyword_only_and_required():
    model, opt, loss = parts()
    with pytest.raises(TypeError):
        hk.Trainer(model, opt, loss, 8)
    with pytest.raises(TypeError):
        hk.Trainer(model, opt, loss)


def test_history_keeps_one_value_per_epoch_per_name():
    h = History(resumed_from_epoch=2)
    h.append(2, {"loss": 1.5, "lr": 0.1})
    h.append(3, {"loss": 1.25, "lr": 0.05})
    assert h.history == {"loss": [1.5, 1.25], "lr": [0.1, 0.05]}
    assert h.epoch == [2, 3] and h.resumed_from_epoch == 2 and not h.stopped


def test_callbacks_get_only_the_methods_they_define():
    seen = []

    class EpochsOnly:
        def on_epoch_end(self, epoch, logs):
            seen.append((epoch, logs))

    cbs = check_callbacks([EpochsOnly()])
    call_callbacks(cbs, "on_train_begin", None)
    call_callbacks(cbs, "on_epoch_end", 0, {"loss": 1.0})
    assert seen == [(0, {"loss": 1.0})]
    assert check_callbacks(None) == []


def test_the_learning_state_saves_and_restores_every_part_and_refuses_another_set():
    model, opt, _ = parts()
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    state = LearningState({"scheduler": sched, "scaler": scaler, "lr_rule": None})
    opt.step()
    sched.step()
    saved = state.state_dict()
    assert set(saved) == {"scheduler", "scaler"} and saved["scaler"]["scale"] == 1024.0
    model2, opt2, _ = parts()
    sched2 = torch.optim.lr_scheduler.StepLR(opt2, step_size=1, gamma=0.5)
    scaler2 = torch.amp.GradScaler("cpu", init_scale=8.0)
    LearningState({"scheduler": sched2, "scaler": scaler2}).load_state_dict(saved)
    assert sched2.last_epoch == 1 and scaler2.get_scale() == 1024.0
    with pytest.raises(KeyError, match="the checkpoint holds"):
        LearningState({"scheduler": sched2}).load_state_dict(saved)


def test_a_worker_that_joins_and_is_given_rank_0_says_it_writes_the_checkpoints_as_a_survivor_does(monkeypatch):
    """What the Trainer logs after each sync of ``hk.elastic.run`` (``_epochs`` calls ``_say_rank0``) at the ranks
    Horovod's driver gives: a new worker in a slot of the first host comes before the running workers of the hosts
    after it. Before, no process said it had become rank 0 (the checkpoint store, which took the lock silently
    under in-process recovery, was the only place that could)."""
    import logging
    import os
    from types import SimpleNamespace

    from hvdkit.core.recovery import RankWatch

    got = []
    handler = logging.Handler()
    handler.emit = got.append
    logger = logging.getLogger("hvdkit.trainer")
    monkeypatch.setattr(logger, "level", logging.INFO)
    logger.addHandler(handler)

    def trainer():
        t = hk.Trainer.__new__(hk.Trainer)  # without Horovod: only the parts that the sync's steps use
        t._ranks = RankWatch()  # as _fit_in_process makes it
        t.checkpointer = object()  # a checkpoint_dir (nothing is written here)
        t._start = lambda: SimpleNamespace(epoch=0, step=0, position={}, history=History())
        return t

    def sync(t, rank, step, start=False):
        """What the trainer logs after a sync that gives it ``rank`` at ``step``."""
        t.comm, before = SimpleNamespace(rank=rank), len(got)
        if start:  # the job's start: State.sync runs on_start on every rank
            t._start_job(SimpleNamespace())
        t._say_rank0(step)
        return [rec.getMessage() for rec in got[before:]]

    try:
        now = f"rank 0 is now process {os.getpid()}"
        joined, started, survivor = trainer(), trainer(), trainer()
        assert sync(joined, 0, 30) == [f"{now} (a worker that joined): it writes the checkpoints from step 30"]
        assert sync(joined, 0, 40) == []  # still rank 0 at the next sync: said once
        assert sync(started, 0, 0, start=True) == []  # rank 0 from the job's start
        assert sync(survivor, 1, 0, start=True) == []
        assert sync(survivor, 0, 30) == [f"{now} (was rank 1): it writes the checkpoints from step 30"]
    finally:
        logger.removeHandler(handler)

"""The one-process parts of in-process recovery for Keras (``hvdkit.keras.elastic``): the rest of an epoch from a
global sample offset, the accumulation changed on a built optimizer, and the refusal of a ``fit`` outside
``hk.elastic.run`` under ``--recovery in-process``. The recovery itself: tests/e2e/test_in_process_recovery_keras.py.
"""

import numpy as np
import pytest

# Importing TensorFlow, Keras and hvdkit.keras sets environment variables: here, at collection (the conftest
# fails a test that changes the environment).
keras = pytest.importorskip("keras")
tf = pytest.importorskip("tensorflow")

import hvdkit.keras as hk  # noqa: E402
from hvdkit.core.errors import ConfigError  # noqa: E402
from hvdkit.keras import elastic  # noqa: E402
from hvdkit.tensorflow.data import epoch_dataset  # noqa: E402


def batches(start, size=1, rank=0, epoch=1):
    announced = []
    ds, steps = epoch_dataset(
        np.arange(23), 4, epoch + 1, epoch, seed=7, rank=rank, size=size, global_batch_size=8, start=start,
        on_batch=lambda e, s, idx: announced.append((e, s, list(idx))),
    )  # fmt: skip
    got = [b.numpy().tolist() for b in ds]
    assert len(got) == steps
    return got, announced


@pytest.mark.parametrize("size", [1, 2])
def test_the_rest_of_an_epoch_from_a_sample_offset_is_the_tail_of_the_whole_epoch_with_its_step_numbers(size):
    for rank in range(size):
        whole, whole_steps = batches(0, size, rank)
        rest, rest_steps = batches(16, size, rank)  # two optimizer steps of 8 done, one left (7 samples)
        per_step = 2 // size  # micro-batches per step and rank
        assert rest == whole[2 * per_step :] and len(rest) == per_step
        assert rest_steps == whole_steps[2 * per_step :] and {s for _, s, _ in rest_steps} == {2}


def test_the_rest_of_an_epoch_holds_one_epoch_only():
    with pytest.raises(ConfigError, match="epochs=initial_epoch \\+ 1"):
        epoch_dataset(np.arange(23), 4, 3, 1, global_batch_size=8, rank=0, size=1, start=8)


def built(accumulation=1):
    opt = hk.DistributedOptimizer(keras.optimizers.SGD(0.1, momentum=0.9), backward_passes_per_step=accumulation)
    opt.build([keras.Variable(np.zeros(3, np.float32))])
    return opt


def counter(opt):
    return int(next(v for v in opt.variables if v.name == "iteration").numpy())


def test_an_optimizer_built_under_in_process_recovery_can_accumulate_later_and_keeps_its_step_count(monkeypatch):
    monkeypatch.setenv("HVDKIT_RECOVERY", "in-process")
    opt = built()
    assert opt.gradient_accumulation_steps is None  # it does not accumulate: the same maths as without recovery
    next(v for v in opt.variables if v.name == "iteration").assign(6)  # 6 optimizer steps at 2 ranks
    elastic.set_accumulation(opt, 2)  # 1 rank left: 2 batches per step
    assert opt.gradient_accumulation_steps == 2 and counter(opt) == 12 and int(opt.iterations.numpy()) == 6
    elastic.set_accumulation(opt, 1)  # 2 ranks again
    assert opt.gradient_accumulation_steps is None and counter(opt) == 6


def test_an_optimizer_built_without_accumulators_cannot_be_made_to_accumulate_and_says_why():
    opt = built()  # outside in-process recovery: Keras makes no accumulators
    with pytest.raises(ConfigError, match="built without gradient accumulators"):
        elastic.set_accumulation(opt, 2)
    assert opt.gradient_accumulation_steps is None and counter(opt) == 0


def test_a_fit_outside_hk_elastic_run_under_in_process_recovery_stops_at_its_first_step_naming_the_fix(monkeypatch):
    """Before, such a script trained as a fixed-size job under Horovod's elastic driver: the first lost worker ended
    it, with nothing to go back to."""
    monkeypatch.setenv("HVDKIT_RECOVERY", "in-process")
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    model.compile(optimizer=hk.DistributedOptimizer(keras.optimizers.SGD(0.1)), loss="mse")
    with pytest.raises(ConfigError) as e:
        model.fit(np.ones((4, 2), np.float32), np.ones((4, 1), np.float32), epochs=1, verbose=0)
    assert "the optimizer's apply() was called outside hk.elastic.run" in str(e.value)
    assert "hk.elastic.fit" in str(e.value) and "--recovery restart" in str(e.value)


# ---------------------------------------------------------------- stop on a signal, resume from disk
class Stops:
    """hk.elastic.fit's Preemption as _Progress uses it: the guard's decision given (a stop after ``at``), the
    checkpoints it would write recorded."""

    def __init__(self, at, every=1):
        self.at, self.every, self.saved, self.said, self.metrics = at, every, [], [], []

    def should_stop(self, step):
        return step == self.at

    def due(self, epochs_done):
        return epochs_done % self.every == 0

    def save(self, epoch, samples_done, history, metrics=None):
        self.saved.append((epoch, samples_done, sorted(history)))
        self.metrics.append(metrics)

    def say_stopped(self, epoch, step):
        self.said.append((epoch, step))


class Commits:
    """The State's part _Progress writes (its values) and calls (``commit``, counted)."""

    def __init__(self):
        self.epoch, self.step, self.samples_done, self.history, self.commits = 0, 0, 0, {}, 0
        self.metrics = None

    def commit(self):
        self.commits += 1


def progress_fit(stops, epochs=3, n=40, batch=8):
    """A plain one-process ``model.fit`` of ``epochs`` epochs of ``n`` samples with fit's _Progress (a commit
    every 100 steps: only at epoch ends); the state, and the epochs whose end Keras called."""
    from collections import deque

    from hvdkit.core import LocalCommunicator
    from hvdkit.core.data import plan_batches, step_bounds
    from hvdkit.core.recovery import CommitSchedule
    from hvdkit.keras.elastic.fit import _Progress

    plan = plan_batches(batch, 1, None, 1)
    bounds = step_bounds(n, 0, plan.global_batch_size, plan.slots)
    state, ended = Commits(), []
    batches = deque([[i] for i in range(epochs * len(bounds))])  # what the input pipeline would announce
    schedule = CommitSchedule(100, LocalCommunicator())
    progress = _Progress(state, plan, bounds, bounds, 0, schedule, batches, None, stops, LocalCommunicator)
    ends = keras.callbacks.LambdaCallback(on_epoch_end=lambda e, logs: ended.append(e))
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    model.compile(optimizer=keras.optimizers.SGD(0.01), loss="mse")
    x, y = np.ones((n, 2), np.float32), np.ones((n, 1), np.float32)
    model.fit(x, y, batch_size=batch, epochs=epochs, shuffle=False, verbose=0, callbacks=[ends, progress])
    return state, ended, progress


def test_a_stop_mid_epoch_checkpoints_that_step_with_its_sample_offset_and_leaves_the_cut_epoch_out():
    stops = Stops(at=7)  # 5 steps of 8 an epoch: step 7 is the second of epoch 1
    state, ended, progress = progress_fit(stops)
    assert progress.stopped and progress.model.stop_training
    assert stops.saved == [(1, 0, [0]), (1, 16, [0])]  # epoch 0 done, then the stop: 1 epoch done and 16 samples
    # the stop's checkpoint holds the metric state of epoch 1's 16 samples (the loss tracker's total and count)
    (total, count), mine = stops.metrics[1]["ranks"][0], float(progress.model.metrics[0].result())
    assert stops.metrics[0] is None and stops.metrics[1]["layout"] == ["loss/total[]", "loss/count[]"]
    assert count == 16 and total / count == pytest.approx(mine, rel=1e-6)
    assert stops.said == [(1, 7)]
    # Keras still ended the epoch it broke out of (epoch 1); fit's History and commits leave it out
    assert ended == [0, 1] and sorted(state.history) == [0]
    assert (state.epoch, state.step, state.samples_done, state.commits) == (1, 7, 16, 1)


def test_a_stop_at_an_epochs_last_step_checkpoints_the_epochs_end_whatever_the_callbacks_every():
    stops = Stops(at=10, every=5)  # the last step of epoch 1; the callback alone would write every 5 epochs
    state, ended, _ = progress_fit(stops)
    assert stops.saved == [(2, 0, [0, 1])] and stops.said == [(1, 10)]
    assert ended == [0, 1] and sorted(state.history) == [0, 1]
    assert (state.epoch, state.step, state.samples_done) == (2, 10, 0)
    assert state.commits == 1  # epoch 0's end; not the stop's (a host update there would start training again)


def test_without_a_stop_every_epoch_end_commits_and_checkpoints_at_the_callbacks_every():
    stops = Stops(at=None, every=2)
    state, ended, progress = progress_fit(stops, epochs=4)
    assert not progress.stopped and ended == [0, 1, 2, 3] and sorted(state.history) == [0, 1, 2, 3]
    assert [s[:2] for s in stops.saved] == [(2, 0), (4, 0)] and state.commits == 4


def test_fit_writes_its_one_checkpoint_callback_itself_and_refuses_two_naming_them():
    from hvdkit.keras.elastic.preempt import checkpoint_callback

    average, ckpt = hk.MetricAverageCallback(), hk.CheckpointCallback("ckpt/a")
    assert checkpoint_callback([average, ckpt]) == (ckpt, [average])
    assert checkpoint_callback([average]) == (None, [average])
    with pytest.raises(ConfigError, match="one hk.CheckpointCallback \\(got 2: 'ckpt/a', 'ckpt/b'\\)"):
        checkpoint_callback([ckpt, hk.CheckpointCallback("ckpt/b")])


def test_the_position_a_checkpoint_of_fit_holds_reads_back_as_it_was_saved(tmp_path):
    """Through the real Checkpointer (size-1 communicator): the epoch, the step, the epoch's sample offset and the
    History's {epoch: logs}, whose int keys come back as ints."""
    from hvdkit.core import LocalCommunicator
    from hvdkit.keras.elastic.preempt import extra, position
    from hvdkit.tensorflow.checkpoint import Checkpointer

    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    opt = keras.optimizers.SGD(0.1)
    opt.build(model.trainable_variables)
    opt.iterations.assign(30)
    history = {0: {"loss": 0.5, "accuracy": 0.75}}
    ckpt = Checkpointer(tmp_path, model, opt, comm=LocalCommunicator())
    ckpt.save(30, 1, extra=extra(448, history))
    got = position(Checkpointer(tmp_path, model, opt, comm=LocalCommunicator()).restore())
    assert got == {"epoch": 1, "step": 30, "samples_done": 448, "history": history, "metrics": None}
    assert position(None) == {"epoch": 0, "step": 0, "samples_done": 0, "history": {}, "metrics": None}
    ckpt.save(46, 2, extra=extra(0, {**history, 1: {"loss": 0.25}}))  # an epoch's end: no offset stored
    assert position(Checkpointer(tmp_path, model, opt, comm=LocalCommunicator()).restore())["samples_done"] == 0


def test_a_checkpoint_whose_sample_offset_is_not_a_count_is_refused_naming_it():
    from hvdkit.core.checkpoint.store import Resumed
    from hvdkit.keras.elastic.preempt import position

    with pytest.raises(ConfigError, match="samples_done='16'"):
        position(Resumed(7, 1, 2, {"samples_done": "16"}, "ckpt/step-7"))
    assert position(Resumed(23, 1, 2, None, "ckpt/step-23"))["epoch"] == 1  # an epoch-end one of a plain fit


# ---------------------------------------------------------------- commit_every="auto"
_AUTO_FIT = """
import importlib, json, logging
import numpy as np, keras
import hvdkit, hvdkit.keras as hk
fit_module = importlib.import_module("hvdkit.keras.elastic.fit")  # the module: the package's "fit" is the function
hk.init()
logging.getLogger("hvdkit").setLevel(logging.INFO)
commits = []
class Counted(fit_module.State):
    def commit(self):
        commits.append(int(self.optimizer.iterations.numpy()))
        super().commit()
fit_module.State = Counted
keras.utils.set_random_seed(0)
model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
model.compile(optimizer=hk.DistributedOptimizer(keras.optimizers.SGD(0.01)), loss="mse")
x, y = np.ones((80, 2), np.float32), np.ones((80, 1), np.float32)
history = hk.elastic.fit(model, (x, y), batch_size=8, epochs=3)  # commit_every left at its default
print(json.dumps({"hvdkit": hvdkit.__file__, "commits": commits, "steps": history.step, "epochs": history.epoch}))
"""


def test_fit_commits_every_step_while_auto_measures_then_at_the_interval_it_logs_and_at_every_epoch_end():
    """One real process (hk.init, model.fit): "auto" is the default; the first 6 steps commit (5 step times), then
    the interval rank 0 logs, counted from the decision, and every epoch end (10 steps an epoch)."""
    import json
    import re

    from helpers import PYTHON, ROOT, run_bounded

    proc = run_bounded([PYTHON, "-c", _AUTO_FIT], timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["hvdkit"].startswith(str(ROOT / "hvdkit"))
    (every,) = map(int, re.findall(r"committing every (\d+) step\(s\)", proc.stderr))
    assert 1 <= every <= 1000 and "set commit_every to choose" in proc.stderr
    assert got["steps"] == 30 and got["epochs"] == [0, 1, 2]
    ends = {10, 20, 30}
    expected = sorted({1, 2, 3, 4, 5, 6} | ends | set(range(6 + every, 30, every)))
    assert got["commits"] == expected, (every, got["commits"])


@pytest.mark.parametrize("bad", [0, "sometimes", 2.5])
def test_fit_refuses_a_commit_every_that_is_neither_auto_nor_a_count_naming_it_and_the_fix(bad):
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    model.compile(optimizer=hk.DistributedOptimizer(keras.optimizers.SGD(0.1)), loss="mse")
    with pytest.raises(ConfigError, match=f"commit_every must be an integer >= 1 \\(got {bad!r}\\); pass 'auto'"):
        hk.elastic.fit(model, (np.ones((4, 2)), np.ones((4, 1))), batch_size=2, epochs=1, commit_every=bad)


# ---------------------------------------------------------------- a stop, then a resume, in one real process
_STOP_RESUME_FIT = """
import json, os, signal, sys
import numpy as np, keras
import hvdkit, hvdkit.keras as hk
hk.init()
x = np.random.default_rng(0).normal(size=(80, 4)).astype(np.float32)
y = (x[:, 0] + 0.5 * x[:, 1] > 0).astype(np.int64)
def model():
    keras.utils.set_random_seed(0)
    m = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
    m.compile(optimizer=hk.DistributedOptimizer(keras.optimizers.SGD(0.1)), metrics=["accuracy"],
              loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return m
def fit(*callbacks):
    return hk.elastic.fit(model(), (x, y), batch_size=8, epochs=3, commit_every=1,
                          callbacks=[hk.MetricAverageCallback(), *callbacks])
class Signal(keras.callbacks.Callback):  # SIGUSR1 to itself after step 4: a stop in epoch 1 (10 steps an epoch)
    def on_train_batch_end(self, batch, logs=None):
        if int(self.model.optimizer.iterations.numpy()) == 4:
            os.kill(os.getpid(), signal.SIGUSR1)
class StopAtEpochEnd(keras.callbacks.Callback):  # as EarlyStopping stops a fit
    def on_epoch_end(self, epoch, logs=None):
        self.model.stop_training = True
whole = fit()
cut = fit(Signal(), hk.CheckpointCallback(sys.argv[1]))
rest = fit(hk.CheckpointCallback(sys.argv[1]), StopAtEpochEnd())
print(json.dumps({"hvdkit": hvdkit.__file__, **{
    name: {"stopped": h.stopped, "resumed_from_epoch": h.resumed_from_epoch, "step": h.step, "epochs": h.epoch,
           "history": h.history}
    for name, h in (("whole", whole), ("cut", cut), ("rest", rest))}}))
"""


@pytest.fixture(scope="module")
def stop_and_resume(tmp_path_factory):
    """One real process (hk.init, size 1): an uninterrupted hk.elastic.fit of 3 epochs; the same fit stopped by
    SIGUSR1 after step 4 (mid-epoch 1) with an hk.CheckpointCallback; a third resumed from that checkpoint, with a
    callback that stops training at the end of an epoch (as EarlyStopping does)."""
    import json

    from helpers import PYTHON, ROOT, run_bounded

    proc = run_bounded([PYTHON, "-c", _STOP_RESUME_FIT, str(tmp_path_factory.mktemp("ckpt"))], timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["hvdkit"].startswith(str(ROOT / "hvdkit"))
    assert got["cut"]["stopped"] and got["cut"]["step"] == 4 and got["cut"]["epochs"] == []
    assert got["rest"]["resumed_from_epoch"] == 0 and not got["rest"]["stopped"]
    return got


def test_a_callback_that_stops_training_in_the_rest_of_a_resumed_epoch_ends_fit_there(stop_and_resume):
    """Before, the epochs after the resumed one were trained all the same (fit's second model.fit ran)."""
    assert stop_and_resume["rest"]["epochs"] == [0] and stop_and_resume["rest"]["step"] == 10


def test_the_resumed_epoch_logs_the_metrics_of_the_whole_epoch_bitwise_as_without_the_stop(stop_and_resume):
    """The checkpoint holds the metric state of the epoch's first 4 steps, added back after Keras's reset. Before,
    the resumed epoch logged the loss and accuracy of its last 6 steps only."""
    whole, rest = stop_and_resume["whole"]["history"], stop_and_resume["rest"]["history"]
    assert sorted(rest) == sorted(whole) == ["accuracy", "loss"]
    assert {k: v[0] for k, v in rest.items()} == {k: v[0] for k, v in whole.items()}


@pytest.fixture
def elastic_records():
    """Every record the hvdkit.elastic logger emits (the hvdkit logger may not propagate)."""
    import logging

    got = []
    handler = logging.Handler()
    handler.emit = got.append
    logger = logging.getLogger("hvdkit.elastic")
    old_level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    yield got
    logger.removeHandler(handler)
    logger.setLevel(old_level)


def test_a_worker_that_joins_and_is_given_rank_0_says_it_writes_the_checkpoints_as_a_survivor_does(
    monkeypatch, elastic_records
):
    """``hk.elastic.fit``'s training function after each sync (``_Fit``), at the ranks Horovod's driver gives: a new
    worker in a slot of the first host comes before the running workers of the hosts after it. Before, only a
    process that had had another rank said it was rank 0 now; a worker that joined as rank 0 said nothing."""
    import importlib
    import os
    from types import SimpleNamespace

    fit_module = importlib.import_module("hvdkit.keras.elastic.fit")  # the package's ``fit`` is the function

    rank = [0]
    monkeypatch.setattr(fit_module.runtime, "rank", lambda: rank[0])

    def train():
        preempt = SimpleNamespace(ckpt=object(), restore=lambda: None)  # a checkpoint callback, nothing to resume
        return fit_module._Fit(None, np.zeros((8, 1)), 2, 3, {"commit_every": 1}, {}, preempt)

    def sync(fit, r, step, start=False):
        """What ``fit`` logs after a sync that gives it rank ``r`` at ``step``."""
        rank[0], before = r, len(elastic_records)
        state = SimpleNamespace(step=step, broadcast_from=lambda root: None)
        if start:  # the job's start: State.sync runs on_start on every rank
            fit.start(state)
        fit._say_rank0(state)
        return [rec.getMessage() for rec in elastic_records[before:]]

    now = f"rank 0 is now process {os.getpid()}"
    joined, started, survivor = train(), train(), train()
    assert sync(joined, 0, 30) == [f"{now} (a worker that joined): it writes the checkpoints from step 30"]
    assert sync(joined, 0, 40) == []  # still rank 0 at the next sync: said once
    assert sync(started, 0, 0, start=True) == []  # rank 0 from the job's start
    assert sync(survivor, 1, 0, start=True) == []
    assert sync(survivor, 0, 30) == [f"{now} (was rank 1): it writes the checkpoints from step 30"]

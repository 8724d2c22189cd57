"""``TrainerOptions``, the Trainer's options as a frozen, checked record: one field per parameter of
``Trainer.__init__`` (so the two cannot drift), nothing assignable after the checks, and the checks'
errors the Trainer's own. One process, no Horovod: building the record starts nothing."""

import dataclasses
import inspect

import pytest

torch = pytest.importorskip("torch")

import hvdkit.torch as hk  # noqa: E402
from hvdkit.core import ConfigError  # noqa: E402
from hvdkit.torch.trainer_options import TrainerOptions  # noqa: E402

# torch's first optimizer in a process sets TORCHINDUCTOR_CACHE_DIR (torch._inductor's cache folder, process-wide):
# made here, at import, so that the first test to build one is not reported as leaking it when this file runs alone.
torch.optim.SGD(torch.nn.Linear(1, 1).parameters(), lr=0.1)

PARAMETERS = [p for p in inspect.signature(hk.Trainer.__init__).parameters.values() if p.name != "self"]


def options(**changes):
    """A valid record: the constructor's defaults, a small model, ``changes`` on top."""
    model = torch.nn.Linear(4, 2)
    given = {p.name: p.default for p in PARAMETERS if p.default is not inspect.Parameter.empty}
    given |= {
        "model": model,
        "optimizer": torch.optim.SGD(model.parameters(), lr=0.1),
        "loss_fn": torch.nn.functional.cross_entropy,
        "batch_size": 8,
    }
    return TrainerOptions(**(given | changes))


def test_the_fields_are_exactly_the_constructor_parameters_in_order():
    assert [f.name for f in dataclasses.fields(TrainerOptions)] == [p.name for p in PARAMETERS]
    assert len(PARAMETERS) == 30


def test_the_record_is_frozen_after_its_checks():
    o = options()
    with pytest.raises(dataclasses.FrozenInstanceError):
        o.batch_size = 0
    with pytest.raises(dataclasses.FrozenInstanceError):
        o.precision = "fp8"
    assert o.batch_size == 8 and o.precision == "fp32"


def test_the_defaults_are_kept_in_the_form_the_loop_reads():
    o = options()
    assert o.metrics == {} and o.callbacks == [] and o.checkpoint_every is None and o.compression == "auto"
    assert o.lr_rule == "none" and o.commit_every == "auto" and o.seed == 0 and o.keep == 3

    class EpochEnd:
        def on_epoch_end(self, epoch, logs): ...

    callback = EpochEnd()
    o = options(checkpoint_every=50, metrics={"acc": len}, callbacks=(callback,))
    assert o.checkpoint_every == 50 and o.metrics == {"acc": len} and o.callbacks == [callback]


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"batch_size": 0}, "batch_size must be an integer >= 1 (got 0); the per-rank batch size, e.g. 32"),
        ({"precision": "fp8"}, "precision must be one of ('fp32', 'bf16', 'fp16') (got 'fp8')"),
        ({"checkpoint_every": "step"}, "checkpoint_every must be an integer >= 1 (got 'step'); pass 'epoch'"),
        ({"lr_rule": "linear", "global_batch_size": 64}, "use lr_rule='none' with a global batch"),
        ({"commit_every": 0}, "commit_every must be an integer >= 1 (got 0); pass 'auto'"),
        (
            {"writer_priority": "lowest"},
            "writer_priority must be one of ['auto', 'idle', 'low', 'normal'] (got 'lowest')",
        ),
        ({"model": "net"}, "model must be a torch.nn.Module (got str)"),
    ],
)
def test_a_bad_value_raises_the_same_config_error_as_the_trainer(changes, message):
    with pytest.raises(ConfigError) as direct:
        options(**changes)
    assert message in str(direct.value)
    given, changes = options(), dict(changes)
    parts = [changes.pop(name, getattr(given, name)) for name in ("model", "optimizer", "loss_fn")]
    with pytest.raises(ConfigError) as trainer:
        hk.Trainer(*parts, **({"batch_size": 8} | changes))
    assert str(trainer.value) == str(direct.value)

"""Straggler reports for torch training loops (the logic is ``hvdkit.core.straggler``)."""

from ..core.errors import ConfigError
from ..core.straggler import StragglerMonitor as _Monitor
from .runtime import communicator

__all__ = ["StragglerMonitor"]


def StragglerMonitor(threshold=None, name="train", optimizer=None):  # noqa: N802 - reads like the class it returns
    """A ``hvdkit.core.StragglerMonitor`` on this job's communicator.

        opt = hk.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), model=model)
        monitor = hk.StragglerMonitor(threshold=1.2, optimizer=opt)
        for epoch in range(epochs):
            for x, y in loader:
                with monitor.step():                    # the whole step
                    opt.zero_grad(); loss_fn(model(x), y).backward(); opt.step()
            report = monitor.epoch_end(epoch)           # report.straggler: a rank or None

    With ``optimizer`` (an ``hvdkit.torch.DistributedOptimizer``), the time its ``synchronize()``
    spends inside a monitored step, waiting for the other ranks' gradients, is left out of the
    step's time, so timing the whole step points at the slow rank. Without it, time only the
    compute part (everything but ``opt.step()``), or every rank looks as slow as the slowest.
    Collective: every rank creates it with the same ``name`` and calls ``epoch_end()``.
    Env: HVDKIT_STRAGGLER_THRESHOLD (when ``threshold`` is None; default 1.2).
    """
    monitor = _Monitor(communicator(), threshold=threshold, name=name)
    if optimizer is not None:
        _exclude_synchronize(optimizer, monitor)
    return monitor


def _exclude_synchronize(optimizer, monitor):
    """Report the time of every ``optimizer.synchronize()`` to ``monitor`` as a wait."""
    if not callable(getattr(optimizer, "add_synchronize_listener", None)):
        raise ConfigError(
            f"optimizer must be an hvdkit.torch.DistributedOptimizer (got {type(optimizer).__name__}); "
            "wrap it first: hk.DistributedOptimizer(opt, model=model)"
        )
    optimizer.add_synchronize_listener(monitor.add_wait)

"""Whether this rank trains under ``hvdkit run --recovery in-process``, and inside ``hk.elastic.run``: what
``hk.DistributedOptimizer`` checks at its first step (``hvdkit.keras.elastic`` holds the rest, and imports the
optimizer; a module of its own keeps the two from importing each other)."""

from __future__ import annotations

import os
from collections.abc import Mapping

from ..core import env as _env
from ..core.errors import ConfigError

__all__ = ["check_inside_run", "in_process", "inside_run"]

_inside = [0]  # how many hk.elastic.run calls this thread is in (hvdkit.keras.elastic.run counts them)


def in_process(environ: Mapping[str, str] | None = None) -> bool:
    """True when ``hvdkit run --recovery in-process`` started this rank (HVDKIT_RECOVERY=in-process)."""
    return (os.environ if environ is None else environ).get(_env.RECOVERY) == "in-process"


def inside_run() -> bool:
    """True inside a function that ``hk.elastic.run`` runs (``hk.elastic.fit`` too)."""
    return _inside[0] > 0


def check_inside_run(what: str) -> None:
    """ConfigError when this rank runs under ``--recovery in-process`` but trains outside ``hk.elastic.run``.

    Such a script would run as a fixed-size job under Horovod's elastic driver: the first lost worker would
    end it with nothing to go back to. ``what`` names the call that found it.
    """
    if in_process() and not inside_run():
        raise ConfigError(
            f"{what} was called outside hk.elastic.run, but this job was started by `hvdkit run --recovery "
            "in-process`, which recovers only training state it knows: call hk.elastic.fit(model, (x, y), "
            "batch_size=..., epochs=...) instead of model.fit, or put model.fit in a function decorated with "
            "@hk.elastic.run with an hk.elastic.State (docs/elastic.md, 'In-process recovery'); or start the job "
            "with --recovery restart"
        )

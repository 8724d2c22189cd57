"""``hk.elastic.run`` for Keras: the loop that syncs the state, runs the training and recovers in-process."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import tensorflow as tf

from ...core.errors import ConfigError
from ...core.recovery import RESET_ATTEMPTS, begin_recovery, recover_in_process, reset_with_retries, say_recovered
from ...tensorflow import runtime
from ...tensorflow._engine import horovod_tf
from .._recovery_scope import _inside, in_process
from .state import State

__all__ = ["RESET_ATTEMPTS", "run"]


def _lost_worker(error):
    """True for a failed Horovod collective: Horovod's own error, or TensorFlow's for a Horovod op."""
    from horovod.common.exceptions import HorovodInternalError

    if isinstance(error, HorovodInternalError):
        return True
    return isinstance(error, tf.errors.OpError) and "Horovod" in str(error.message)


def run(func: Callable[..., Any]) -> Callable[..., Any]:
    """Decorate the training function ``func(state, ...)`` so that it survives lost workers in-process.

    Under ``hvdkit run --recovery in-process``: the state is synced (the start: ``on_start``; later the newest
    commit) and ``func`` called; when a collective fails because a worker was lost (in ``fit``'s train step or
    in a commit), every rank left goes back to its last commit, Horovod re-forms the ring without the lost
    worker, and ``func`` is called again from there (at the smaller size: ``on_resize``); when the driver
    has a new worker, the ranks stop at their next commit and ``func`` goes on with it. Rank 0 logs each
    recovery with its time. Outside in-process recovery, ``func`` runs once after the start's sync.
    Collective: every rank calls the decorated function with its ``State``.
    """

    @functools.wraps(func)
    def wrapper(state: State, *args: Any, **kwargs: Any) -> Any:
        if not isinstance(state, State):
            raise ConfigError(
                f"@hk.elastic.run needs an hk.elastic.State as the first argument (got {type(state).__name__})"
            )
        runtime.init()
        _inside[0] += 1
        try:
            if not in_process():
                state.sync()
                return func(state, *args, **kwargs)
            return _run_in_process(func, state, args, kwargs)
        finally:
            _inside[0] -= 1

    return wrapper


def _run_in_process(func, state, args, kwargs):
    from horovod.common.elastic import notification_manager
    from horovod.common.exceptions import HorovodInternalError, HostsUpdatedInterrupt

    notification_manager.init()
    notification_manager.register_listener(state)
    try:
        return recover_in_process(
            lambda: func(state, *args, **kwargs),
            state,
            joins=HostsUpdatedInterrupt,
            is_lost=_lost_worker,
            begin=lambda cause, error: _begin_recovery(state, cause, error),
            reset=lambda: _form_again(state, HorovodInternalError),
            recovered=lambda: _say_recovered(state),
        )
    finally:
        notification_manager.remove_listener(state)


def _form_again(state, lost):
    """The ring formed again (``_reset``), rank-prefixed logging for this rank and size, the state told."""
    _reset(state, lost)
    runtime.init()
    state.on_reset()


def _reset(state, lost):
    """Shut Horovod down and start it again (the driver's next rendezvous forms the new ring), tried again when a
    worker is lost while it forms (``hvdkit.core.recovery.reset_with_retries``)."""
    hvd = horovod_tf()

    def restart():
        hvd.shutdown()
        hvd.init()

    reset_with_retries(restart, lost, state)


def _begin_recovery(state, cause, error):
    hvd = horovod_tf()
    begin_recovery(state, cause, hvd.size(), hvd.rank(), None if error is None else _summary(error))


def _summary(error):
    """One line of ``error``: TensorFlow's message of a failed op is many lines of where the op was made; the
    line that names Horovod says what failed."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    named = [line for line in lines if "Horovod" in line or "Gloo" in line]
    return (named or lines or [type(error).__name__])[0][:300]


def _say_recovered(state):
    say_recovered(state, runtime.size(), runtime.is_rank0())

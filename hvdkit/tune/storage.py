"""Where a study lives and how it prunes: Optuna storage and pruner from ``hvdkit tune``'s flags.

Imports Optuna: only ``hvdkit tune`` loads this module.
"""

from __future__ import annotations

import os
from typing import Any

from ..core.errors import ConfigError, MissingDependencyError

__all__ = ["PRUNERS", "DEFAULT_JOURNAL", "import_optuna", "open_storage", "make_pruner", "describe_storage"]

PRUNERS = ("median", "asha", "none")
DEFAULT_JOURNAL = "study.journal"  # in --out: Optuna's journal file, an embedded store (nothing to start)


def import_optuna() -> Any:
    """The ``optuna`` module, quiet (hvdkit prints its own progress); MissingDependencyError without it."""
    try:
        import optuna
    except ImportError:
        raise MissingDependencyError(
            "hvdkit tune needs Optuna: run 'make setup', or pip install 'hvdkit[tune]'"
        ) from None
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    return optuna


def is_rdb_url(storage: str) -> bool:
    """True for an SQLAlchemy URL (``sqlite:///x.db``, ``postgresql://...``); else a journal file path."""
    return "://" in storage


def describe_storage(storage: str | None, out: str) -> str:
    """The storage in words, for the first line ``hvdkit tune`` prints."""
    if storage is None:
        return f"journal file {os.path.join(out, DEFAULT_JOURNAL)}"
    return f"database {storage.split('://', 1)[0]}://..." if is_rdb_url(storage) else f"journal file {storage}"


def open_storage(storage: str | None, out: str) -> Any:
    """The Optuna storage for ``--storage`` (an RDB URL, or a journal file path) or, without it, the
    journal file ``OUT/study.journal``. A journal file works from several processes and hosts on a
    shared file system; an RDB URL needs its database server (PostgreSQL, MySQL) or a SQLite file."""
    optuna = import_optuna()
    if storage is not None and is_rdb_url(storage):
        try:
            return optuna.storages.RDBStorage(storage)
        except ImportError as e:
            raise MissingDependencyError(
                f"--storage {storage.split('://')[0]}://...: {e}; install its driver"
            ) from None
        except Exception as e:  # SQLAlchemy's errors: a bad URL, a server that is not there
            raise ConfigError(f"--storage {storage!r} cannot be opened: {type(e).__name__}: {e}") from None
    path = os.path.join(out, DEFAULT_JOURNAL) if storage is None else storage
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise ConfigError(f"--storage {path!r}: folder {folder!r} does not exist; create it or give another path")
    from optuna.storages.journal import JournalFileBackend

    return optuna.storages.JournalStorage(JournalFileBackend(path))


def make_pruner(name: str, startup_trials: int, warmup_epochs: int = 0) -> Any:
    """Optuna's pruner for ``--pruner``: ``median`` (MedianPruner: stop a trial whose value at an epoch
    is worse than the median of earlier trials' at that epoch, once ``startup_trials`` trials have
    finished, from epoch ``warmup_epochs`` on), ``asha`` (SuccessiveHalvingPruner: rungs at epochs
    1, 3, 9, ...; keep the best third), ``none``."""
    optuna = import_optuna()
    if name == "median":
        return optuna.pruners.MedianPruner(n_startup_trials=startup_trials, n_warmup_steps=warmup_epochs)
    if name == "asha":
        return optuna.pruners.SuccessiveHalvingPruner(min_resource=1, reduction_factor=3)
    if name == "none":
        return optuna.pruners.NopPruner()
    raise ConfigError(f"--pruner must be one of {', '.join(PRUNERS)} (got {name!r})")

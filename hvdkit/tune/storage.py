"""Where a study lives and how it prunes: Optuna storage and pruner from ``hvdkit tune``'s flags.

Imports Optuna: only ``hvdkit tune`` loads this module.
"""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import time
from typing import Any

from ..core.errors import ConfigError, MissingDependencyError

__all__ = [
    "PRUNERS",
    "DEFAULT_JOURNAL",
    "import_optuna",
    "open_storage",
    "check_journal",
    "make_sampler",
    "make_pruner",
]

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


def open_storage(storage: str | None, out: str) -> Any:
    """The Optuna storage for ``--storage`` (an RDB URL, or a journal file path) or, without it, the
    journal file ``OUT/study.journal``. A journal file works from several processes and hosts on a
    shared file system; an RDB URL needs its database server (PostgreSQL, MySQL) or a SQLite file."""
    optuna = import_optuna()
    if storage is not None and is_rdb_url(storage):
        return _open_rdb(optuna, storage)
    path = os.path.join(out, DEFAULT_JOURNAL) if storage is None else storage
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise ConfigError(f"--storage {path!r}: folder {folder!r} does not exist; create it or give another path")
    from optuna.storages.journal import JournalFileBackend

    check_journal(path)
    return optuna.storages.JournalStorage(JournalFileBackend(path))


def check_journal(path: str) -> None:
    """ConfigError naming the first damaged line of the journal file ``path`` (one a writer killed in the
    middle of it left cut short) and how to repair it; nothing if ``path`` is missing or whole. Optuna
    would fail on it with a bare JSONDecodeError, or append to it and lose what it wrote. The check
    holds the journal's write lock (Optuna's symlink lock), so a line another worker is writing is whole."""
    if not os.path.isfile(path):
        return
    from optuna.storages.journal import JournalFileSymlinkLock

    lock = JournalFileSymlinkLock(path)
    lock.acquire()
    try:
        bad, total = _damaged_line(path)
    finally:
        lock.release()
    if bad is None:
        return
    number, offset, why = bad
    where = f"journal file {path!r}: line {number} of {total} is damaged ({why})"
    if number < total:
        raise ConfigError(
            f"{where}, and {total - number} line(s) after it may depend on it: restore the file from a copy"
        )
    raise ConfigError(
        f"{where}: a process was probably killed while writing it. Remove that line, which loses only the "
        f"study's last change (truncate -s {offset} {shlex.quote(path)}), or restore the file from a copy; "
        "then run again"
    )


def _damaged_line(path: str) -> tuple[tuple[int, int, str] | None, int]:
    """``((line number, its byte offset, what is wrong), lines)`` of the first damaged line; (None, lines)."""
    bad, offset, total = None, 0, 0
    with open(path, "rb") as f:
        for total, line in enumerate(f, start=1):
            if bad is None:
                why = _line_fault(line)
                bad = (total, offset, why) if why else None
            offset += len(line)
    return bad, total


def _line_fault(line: bytes) -> str:
    if not line.endswith(b"\n"):
        return "cut short: no end of line"
    try:
        json.loads(line)
    except json.JSONDecodeError as e:
        return f"not JSON at column {e.colno}: {e.msg}"
    except ValueError as e:  # not UTF-8
        return f"not JSON: {e}"
    return ""


DRIVERS = {  # a dialect's usual driver: URL prefix and package
    "postgresql": "postgresql+psycopg2:// with pip install psycopg2-binary",
    "mysql": "mysql+pymysql:// with pip install PyMySQL",
}


def shown_url(url: str) -> str:
    """``url`` as it may be printed: its password replaced by ``***`` (SQLAlchemy's own rendering). A URL
    SQLAlchemy cannot parse, or one with several ``@``, gets everything between ``USER:`` and the last
    ``@`` masked: SQLAlchemy splits at the first ``@``, and the rest of an unescaped password would show."""
    parsed = _parsed(url)
    if parsed is None or url.count("@") > 1:
        return _masked(url)
    return url if parsed.password is None else parsed.render_as_string(hide_password=True)


def _parsed(url: str) -> Any:
    """SQLAlchemy's URL object for ``url``; None if it does not parse."""
    try:
        from sqlalchemy.engine import make_url

        return make_url(url)
    except Exception:  # ArgumentError, ValueError (a bad port), or no SQLAlchemy
        return None


def _masked(url: str) -> str:
    scheme, sep, rest = url.partition("://")
    userinfo, at, where = rest.rpartition("@")
    if not sep or rest.startswith("/") or not at or ":" not in userinfo:
        return url
    return f"{scheme}://{userinfo.split(':', 1)[0]}:***@{where}"


def _secrets(url: str) -> list[str]:
    """What may be ``url``'s password, longest first: as SQLAlchemy reads it, and up to the last ``@``."""
    rest = url.partition("://")[2]
    userinfo, at, _ = rest.rpartition("@")
    found = {userinfo.partition(":")[2] if at and not rest.startswith("/") else ""}
    parsed = _parsed(url)
    if parsed is not None:
        found.add(parsed.password or "")
    return sorted(filter(None, found), key=len, reverse=True)


def _error_text(e: Exception, url: str, shown: str) -> str:
    """The first line of ``e``'s message, with no part of ``url``'s password in it."""
    first = str(e).replace(url, shown).splitlines()[0] if str(e) else ""
    secrets = _secrets(url)
    if secrets and _parsed(url) is None:  # SQLAlchemy's parse errors quote pieces of the URL, the password's too
        return (
            "SQLAlchemy cannot parse the URL (its message is not shown: it quotes part of the password); "
            "characters @ : / % in the user name or password must be percent-encoded (%40 %3A %2F %25)"
        )
    for secret in secrets:
        first = first.replace(secret, "***")
    return first


def _open_rdb(optuna: Any, url: str, tries: int = 5) -> Any:
    shown = shown_url(url)
    try:
        for attempt in range(1, tries + 1):
            try:
                return optuna.storages.RDBStorage(url)
            except Exception as e:
                # workers that open a new database at once race to create Optuna's tables: the loser's
                # CREATE TABLE fails with "already exists"; the tables are there now, so open again
                if attempt == tries or "already exists" not in str(e):
                    raise
                time.sleep(0.2 * attempt)
    except ImportError as e:
        cause = e.__cause__ or e.__context__
        module = getattr(cause, "name", None) or "its driver"
        dialect = url.split("://", 1)[0].split("+")[0]
        usual = DRIVERS.get(dialect, "a driver SQLAlchemy lists for this dialect")
        raise MissingDependencyError(
            f"--storage {shown!r}: the database driver {module!r} is not installed; install it, or use "
            f"{usual}, or give a journal file path on shared storage instead"
        ) from None
    except Exception as e:  # SQLAlchemy's errors: a bad URL, a server that is not there
        first = _error_text(e, url, shown)
        raise ConfigError(
            f"--storage {shown!r} cannot be opened: {type(e).__name__}: {first}; check the URL "
            "(dialect+driver://user:password@host:port/database) and that its database server runs and the "
            "database exists"
        ) from None


def make_sampler(seed: int | None, trials_before: int) -> Any:
    """Optuna's TPE sampler for ``--seed``, on a study that holds ``trials_before`` trials. A study that has
    trials (a resumed run, a worker that joins later) gets a seed derived from both: seeded afresh with
    ``seed`` itself, the sampler would draw its first trials' parameters again. A new study gets ``seed``
    as given, so a run is repeatable from the same study either way."""
    optuna = import_optuna()
    if seed is not None and trials_before > 0:
        digest = hashlib.sha256(f"hvdkit tune: seed {seed} after {trials_before} trials".encode()).digest()
        seed = int.from_bytes(digest[:4], "big")
    return optuna.samplers.TPESampler(seed=seed)


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

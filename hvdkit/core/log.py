"""Rank-prefixed logging: ``[rank 1/2] hvdkit.checkpoint: saved step 40``."""

from __future__ import annotations

import logging
import sys
from typing import TextIO

from . import env as _env
from .topology import Topology

__all__ = ["get_logger", "configure", "set_topology"]

_ROOT = "hvdkit"
_state = {"topology": None, "handler": None}


class _RankFormatter(logging.Formatter):
    def format(self, record):
        topo = _state["topology"]
        prefix = f"[rank {topo.rank}/{topo.size}] " if topo is not None else ""
        return f"{prefix}{record.name}: {record.getMessage()}" + (
            "\n" + self.formatException(record.exc_info) if record.exc_info else ""
        )


def set_topology(topology: Topology) -> None:
    """Record this process's place in the job, used as the prefix of every hvdkit log line."""
    _state["topology"] = topology


def configure(level: str | int | None = None, stream: TextIO | None = None) -> logging.Logger:
    """Install hvdkit's rank-prefixed handler on the ``hvdkit`` logger (once).

    Env: HVDKIT_LOG_LEVEL (default INFO).
    """
    logger = logging.getLogger(_ROOT)
    level = level or _env.read_choice(_env.LOG_LEVEL, _env.LOG_LEVELS, _env.DEFAULT_LOG_LEVEL, upper=True)
    logger.setLevel(level)
    if _state["handler"] is None:
        handler = logging.StreamHandler(stream or sys.stderr)
        handler.setFormatter(_RankFormatter())
        logger.addHandler(handler)
        logger.propagate = False
        _state["handler"] = handler
    return logger


def get_logger(name: str) -> logging.Logger:
    """A logger under ``hvdkit.`` (``get_logger("checkpoint")`` -> ``hvdkit.checkpoint``)."""
    return logging.getLogger(name if name.startswith(_ROOT) else f"{_ROOT}.{name}")

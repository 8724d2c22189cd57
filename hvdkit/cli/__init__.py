"""The ``hvdkit`` command: one module per sub-command (``run``, ``render``, ``doctor``, ``timeline``,
``bench``, ``engine``, ``tune``), each with ``register(subparsers)`` and ``main(args)``; here the parser, the
dispatch, ``--version`` and the one error rule: an ``HvdkitError`` is one line on stderr and exit 2.
"""

from __future__ import annotations

import argparse
import importlib
import re
import sys
from collections.abc import Sequence
from types import ModuleType

from ..core.errors import HvdkitError

__all__ = ["main", "version_line"]

COMMANDS = ("run", "tune", "render", "timeline", "bench", "engine", "doctor")  # in the order --help lists them


def _command(name: str) -> ModuleType:
    return importlib.import_module(f"{__name__}.{name}")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="hvdkit", description="Horovod/MPI training toolkit.")
    p.add_argument("--version", action="store_true", help="print hvdkit's version and the engine's fix level, and exit")
    sub = p.add_subparsers(dest="cmd", metavar="{" + ",".join(COMMANDS) + "}")
    for name in COMMANDS:
        _command(name).register(sub)
    return p


def installed_engine_level() -> str | None:
    """The fix level of the installed Horovod engine (its ``horovod/hvdkit_fixes.py``), read without
    importing Horovod; None when no engine is installed, ``"upstream"`` for a Horovod without hvdkit's fixes."""
    from importlib.util import find_spec

    try:
        spec = find_spec("horovod")
    except (ImportError, ValueError):
        spec = None
    if spec is None or not spec.submodule_search_locations:
        return None
    for folder in spec.submodule_search_locations:
        try:
            with open(f"{folder}/hvdkit_fixes.py", encoding="utf-8") as f:
                found = re.search(r'^LEVEL = "([^"]+)"', f.read(), re.MULTILINE)
        except OSError:
            continue
        if found:
            return found.group(1)
    return "upstream"


def version_line() -> str:
    """``hvdkit X.Y.Z; engine fixes <level>; installed engine: <level> | none | ...``."""
    from .. import __version__
    from ..engine import fix_level

    shipped = fix_level()
    installed = installed_engine_level()
    if installed is None:
        state = "none (install it: hvdkit engine install)"
    elif installed == shipped:
        state = f"{installed} (current)"
    elif installed == "upstream":
        state = "upstream Horovod without hvdkit's fixes (rebuild it: hvdkit engine install)"
    else:
        state = f"{installed} (another hvdkit's; rebuild it: hvdkit engine install)"
    return f"hvdkit {__version__}; engine fixes {shipped}; installed engine: {state}"


def main(argv: Sequence[str] | None = None) -> int:
    p = _parser()
    args = p.parse_args(argv)
    if args.version:
        sys.stdout.write(version_line() + "\n")
        return 0
    if args.cmd is None:
        p.error(f"a command is required: one of {', '.join(COMMANDS)} (or --version)")
    try:
        return _command(args.cmd).main(args)
    except HvdkitError as e:
        sys.stderr.write(f"hvdkit {args.cmd}: error: {e}\n")
        return 2

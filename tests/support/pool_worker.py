"""One rank of a long-lived pool job (tests/support/pool.py): start Horovod once, then run cases.

Usage: python pool_worker.py JOB_DIR FRAMEWORK  (FRAMEWORK: torch or keras; under mpirun/horovodrun)

The test process writes ``JOB_DIR/case-<n>.json`` (``{"target": "module:function", "args", "params", "env"}``);
every rank runs ``function(*args, **params)`` and writes ``case-<n>.rank<r>.json``: ``{"ok", "value"}`` or
``{"ok": false, "traceback"}``, and ``"retire"`` (why this job must not run another case, or null).
Around each case the rank puts back what a case could leave behind for the next one (``_Snapshot``):
environment, working directory, argv, signal handlers, resource limits, logging, warnings filters,
hvdkit's module globals, the framework's global settings, and seeds every RNG as a fresh process
would be. What cannot be put back (a thread still running, a Horovod process set, a lowered hard
limit) retires the job: the pool starts a fresh one for the next case. ``JOB_DIR/stop`` ends the loop.
"""

import faulthandler
import importlib
import json
import logging
import os
import pkgutil
import random
import resource
import signal
import sys
import threading
import time
import traceback
import warnings
from pathlib import Path
from types import ModuleType

TESTS = Path(__file__).resolve().parents[1]
# Where cases live: the contract workers import their helpers (recording, model_params) by bare name.
CASE_PATHS = [TESTS / "distributed" / "workers", TESTS / "support", TESTS]
PACKAGES = {"torch": ("hvdkit.core", "hvdkit.torch"), "keras": ("hvdkit.core", "hvdkit.keras", "hvdkit.tensorflow")}
SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1, signal.SIGHUP, signal.SIGXFSZ, signal.SIGALRM)
LIMITS = (resource.RLIMIT_FSIZE, resource.RLIMIT_NOFILE, resource.RLIMIT_AS, resource.RLIMIT_DATA)
TORCH_DEFAULT_SEED = 67280421310721  # torch's seed in a fresh process
POLL_S = 0.01


def _import_all(packages):
    """Import every submodule of ``packages`` now, so the snapshot of hvdkit's globals covers them."""
    for name in packages:
        package = importlib.import_module(name)
        for info in pkgutil.walk_packages(package.__path__, name + "."):
            try:
                importlib.import_module(info.name)
            except Exception:  # an optional extra that is not installed: its module is not in the snapshot
                pass


class _Framework:
    """The framework's process-wide settings a case may change, and its start."""

    def __init__(self, name):
        self.name = name
        if name == "torch":
            import hvdkit.torch as hk

            self.hk = hk
        else:
            import hvdkit.keras as hk

            self.hk = hk

    def start(self):
        return self.hk.init()

    def capture(self):
        if self.name == "torch":
            import torch

            return (torch.get_num_threads(), torch.get_default_dtype(), torch.is_grad_enabled())
        return None

    def restore(self, saved):
        if self.name == "torch":
            import torch

            threads, dtype, grad = saved
            torch.set_num_threads(threads)
            torch.set_default_dtype(dtype)
            torch.set_grad_enabled(grad)
            return
        import keras

        keras.mixed_precision.set_global_policy("float32")
        keras.config.set_floatx("float32")
        keras.backend.clear_session()

    def seed(self, rank):
        """Seed every RNG as deterministically as a test can rely on: torch's as in a fresh process,
        the others per rank (in a fresh process they differ between ranks, so here they do too)."""
        random.seed(rank)
        import numpy as np

        np.random.seed(rank)
        if self.name == "torch":
            import torch

            torch.manual_seed(TORCH_DEFAULT_SEED)
        else:
            import keras

            keras.utils.set_random_seed(rank)


class _Snapshot:
    """What a case may change in this process, taken before it and put back after it."""

    def __init__(self, framework):
        self.framework = framework
        self.env = dict(os.environ)
        self.cwd = os.getcwd()
        self.argv = list(sys.argv)
        self.path = list(sys.path)
        self.streams = (sys.stdout, sys.stderr)
        self.signals = {s: signal.getsignal(s) for s in SIGNALS}
        self.limits = {r: resource.getrlimit(r) for r in LIMITS}
        self.umask = os.umask(0o022)
        os.umask(self.umask)
        self.warnings = list(warnings.filters)
        self.loggers = {
            name: (list(lg.handlers), lg.level, lg.propagate, lg.disabled)
            for name, lg in [("", logging.getLogger()), *logging.Logger.manager.loggerDict.items()]
            if isinstance(lg, logging.Logger)
        }
        self.modules = {name: _module_state(mod) for name, mod in _hvdkit_modules()}
        self.threads = set(threading.enumerate())
        self.settings = framework.capture()

    def restore(self):
        """Put everything back; the reasons this process cannot run another case (empty: it can)."""
        retire = []
        os.environ.clear()
        os.environ.update(self.env)
        os.chdir(self.cwd)
        sys.argv[:] = self.argv
        sys.path[:] = self.path
        sys.stdout, sys.stderr = self.streams
        for s, handler in self.signals.items():
            signal.signal(s, handler)
        for r, (soft, hard) in self.limits.items():
            try:
                resource.setrlimit(r, (soft, hard))
            except (ValueError, OSError):
                retire.append(f"resource limit {r} lowered for good")
        os.umask(self.umask)
        warnings.filters[:] = self.warnings
        self._restore_loggers()
        for name, mod in _hvdkit_modules():
            if name in self.modules:
                _restore_module(mod, self.modules[name])
        self.framework.restore(self.settings)
        retire += _leftover_threads(self.threads)
        retire += _extra_process_sets()
        return retire

    def _restore_loggers(self):
        for name, lg in [("", logging.getLogger()), *logging.Logger.manager.loggerDict.items()]:
            if not isinstance(lg, logging.Logger):
                continue
            handlers, level, propagate, disabled = self.loggers.get(name, ([], logging.NOTSET, True, False))
            lg.handlers[:] = handlers
            lg.level, lg.propagate, lg.disabled = level, propagate, disabled
        logging.Logger.manager._clear_cache()


def _hvdkit_modules():
    return [(n, m) for n, m in list(sys.modules.items()) if (n == "hvdkit" or n.startswith("hvdkit.")) and m]


def _module_state(mod):
    """A module's own globals (dunders left alone: ``__builtins__`` is every module's shared dict) and a
    copy of the contents of each dict, list and set among them (a cache filled in place)."""
    names = {k: v for k, v in vars(mod).items() if not k.startswith("__")}
    contents = {k: v.copy() for k, v in names.items() if type(v) in (dict, list, set)}
    return names, contents


def _restore_module(mod, state):
    names, contents = state
    current = vars(mod)
    for k in [k for k, v in current.items() if not k.startswith("__") and k not in names]:
        if not isinstance(current[k], ModuleType):  # a submodule imported since stays its package's attribute
            del current[k]
    for k, v in names.items():
        if current.get(k) is not v:
            current[k] = v
    for k, saved in contents.items():
        live = current[k]
        live.clear()
        live.extend(saved) if isinstance(live, list) else live.update(saved)


def _leftover_threads(before, grace=5.0):
    """A thread the case started and left running (joined for up to ``grace`` s first)."""
    deadline = time.monotonic() + grace
    left = []
    for t in threading.enumerate():
        if t in before or not t.is_alive():
            continue
        t.join(max(0.0, deadline - time.monotonic()))
        if t.is_alive():
            left.append(f"thread {t.name!r} still running")
    return left


def _extra_process_sets():
    try:
        from horovod.common import process_sets
    except ImportError:
        return []
    basics = getattr(process_sets, "_basics", None)
    ids = sorted(basics._get_process_set_ids_and_ranks()) if basics is not None else [0]
    return [f"Horovod process sets {ids} left"] if ids != [0] else []


def _fresh_case_modules():
    """Forget the case modules (tests/...) imported by earlier cases: each case imports them anew."""
    for name, mod in list(sys.modules.items()):
        path = getattr(mod, "__file__", None) or ""
        if path.startswith(str(TESTS)) and not path.endswith("pool_worker.py"):
            del sys.modules[name]


def run_case(case, framework, rank):
    """Run one case on this rank: ``{"ok", "value"|"traceback", "retire"}``."""
    snapshot = _Snapshot(framework)
    out = {"ok": False, "retire": None}
    try:
        for k in [k for k in os.environ if k.startswith("HVDKIT_")]:
            del os.environ[k]
        os.environ.update(case.get("env", {}))
        framework.seed(rank)
        _fresh_case_modules()
        module, _, function = case["target"].partition(":")
        value = getattr(importlib.import_module(module), function)(*case.get("args", []), **case.get("params", {}))
        json.dumps(value)  # what cannot travel back is the case's error, reported here
        out.update(ok=True, value=value)
    except BaseException:  # SystemExit too: a case that calls sys.exit() is a failed case
        out["traceback"] = traceback.format_exc()
    finally:
        retire = snapshot.restore()
        out["retire"] = "; ".join(retire) or None
    return out


def _write(path, data):
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, path)


def _next_case(job_dir, n):
    """The case numbered ``n`` once it is there, or None when the job is told to stop."""
    case_path, stop = job_dir / f"case-{n}.json", job_dir / "stop"
    while not case_path.exists():
        if stop.exists():
            return None
        time.sleep(POLL_S)
    return json.loads(case_path.read_text())


def main(job_dir, framework_name):
    job_dir = Path(job_dir)
    sys.path[:0] = [str(p) for p in CASE_PATHS]
    framework = _Framework(framework_name)
    topo = framework.start()
    rank = topo.rank
    log = open(job_dir / f"rank{rank}.log", "a", buffering=1)  # noqa: SIM115 (the process's life)
    os.dup2(log.fileno(), 1)
    os.dup2(log.fileno(), 2)
    faulthandler.register(signal.SIGUSR2, file=log, all_threads=True)  # the pool asks a hung rank where it is
    _import_all(PACKAGES[framework_name])
    _write(
        job_dir / f"ready.rank{rank}.json", {"rank": rank, "size": topo.size, "pid": os.getpid(), "pgid": os.getpgrp()}
    )
    n = 0
    while (case := _next_case(job_dir, n)) is not None:
        result = run_case(case, framework, rank)
        _write(job_dir / f"case-{n}.rank{rank}.json", result)
        if result["retire"]:
            break
        n += 1
    log.flush()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])

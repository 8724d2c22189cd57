"""What the contract workers share: writing each rank's result (or its named sections), recording
the message of an expected error, the log lines an hvdkit logger wrote, and running with a variable
set for one call."""

import json
import logging
import os


def write_rank_result(out_dir, rank, result):
    """Write this rank's ``result`` to ``out_dir/rank<rank>.json``, where the test reads every rank's."""
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump(result, f, indent=1)


def write_sections(out_dir, topo, **sections):
    """Write ``{"rank", "size", **sections}`` as this rank's result (``topo``: what ``init()`` returned)."""
    write_rank_result(out_dir, topo.rank, {"rank": topo.rank, "size": topo.size, **sections})


def run_sections(init, out_dir, **sections):
    """Start the job (``init()``), run each ``section(rank, size)`` in the order given, write them as this
    rank's result. Collective: every rank runs the same sections in the same order."""
    topo = init()
    write_sections(out_dir, topo, **{name: section(topo.rank, topo.size) for name, section in sections.items()})


def error_of(call, exc_type):
    """The message of the ``exc_type`` that ``call()`` raises, or None when it raises nothing."""
    try:
        call()
    except exc_type as e:
        return str(e)
    return None


class LogRecorder(logging.Handler):
    """Keeps every message logged to ``logger_name`` (``.messages``); ``since(n)``: those after the first n."""

    def __init__(self, logger_name):
        super().__init__()
        self.messages = []
        logging.getLogger(logger_name).addHandler(self)

    def emit(self, record):
        self.messages.append(record.getMessage())

    def since(self, n):
        return self.messages[n:]


def with_env(name, value, fn):
    """``fn()`` with the variable ``name`` set to ``value`` (unset when None), restored afterwards."""
    old = os.environ.pop(name, None)
    if value is not None:
        os.environ[name] = value
    try:
        return fn()
    finally:
        os.environ.pop(name, None)
        if old is not None:
            os.environ[name] = old


def logged_run(recorder, run, broadcast_object):
    """``(result, {"logged_on_rank0", "logged_here"})`` of ``run()``: what it logged on this rank, and
    on rank 0 (``broadcast_object(messages)`` from rank 0, so every rank can check against it)."""
    before = len(recorder.messages)
    result = run()
    here = recorder.since(before)
    return result, {"logged_on_rank0": broadcast_object(here), "logged_here": here}


def logged_runs(logger_name, runs, broadcast_object, describe):
    """``{label: {"logged_on_rank0", "logged_here", **describe(result)}}`` for each ``(label, run)`` in
    ``runs``: what ``run()`` logged to ``logger_name`` (see ``logged_run``) and ``describe`` of what it returned.

    Collective: every rank, the same runs in the same order (each broadcasts rank 0's log lines)."""
    recorder = LogRecorder(logger_name)
    out = {}
    for label, run in runs:
        result, logged = logged_run(recorder, run, broadcast_object)
        out[label] = {**logged, **describe(result)}
    return out

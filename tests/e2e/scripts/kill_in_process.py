"""Run a training example under `hvdkit run --recovery in-process`; SIGKILL the process that is rank R
when it reaches a point, once per job.

    kill_in_process.py MARKER R step:N SCRIPT [ARGS...]     # at its N-th optimizer step (SGD.step)
    kill_in_process.py MARKER R commit:N SCRIPT [ARGS...]   # inside its N-th commit (hk.elastic.State.save)
    kill_in_process.py MARKER R step:N,pace:S SCRIPT ...    # and every optimizer step of every process sleeps S s
    kill_in_process.py MARKER R step:N,join SCRIPT ...      # and the first worker that joins later, right after a
                                                            # rendezvous took its slot (MARKER.join): the others
                                                            # are then forming the ring with it, inside hvd.init

MARKER is a file made with O_EXCL by the process that kills itself, so exactly one process of the job
is killed: a worker that joins later (or the same rank after a recovery) runs unharmed. The example
itself is unchanged: the kill wraps the framework's own step, or hvdkit's commit.
"""

import os
import runpy
import signal
import sys


def _kill_at(original, at, rank, marker):
    calls = {"n": 0}

    def wrapped(*args, **kwargs):
        import horovod.torch as hvd

        calls["n"] += 1
        if calls["n"] >= at and hvd.rank() == rank and not os.path.exists(marker):
            try:
                os.close(os.open(marker, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
            except FileExistsError:
                return original(*args, **kwargs)
            os.kill(os.getpid(), signal.SIGKILL)
        return original(*args, **kwargs)

    return wrapped


def _kill_when_joined(marker):
    """A worker the elastic driver started on standby (a joining one, engine fix 16) dies as soon as a rendezvous
    has taken its slot: the ranks already running are then inside hvd.init, forming the ring with it."""
    from horovod.runner.elastic import worker

    original = worker.wait_until_slot_taken

    def wait_then_die():
        joining = os.environ.get("HOROVOD_ELASTIC_STANDBY") == "1"
        original()
        if joining:
            try:
                os.close(os.open(marker, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
            except FileExistsError:
                return
            os.kill(os.getpid(), signal.SIGKILL)

    worker.wait_until_slot_taken = wait_then_die


def main():
    marker, rank, where, script, args = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5:]
    # every process of the job says it started (a joining worker too): its output reaches the job's
    print(f"kill_in_process: process {os.getpid()} runs {os.path.basename(script)}", flush=True)
    where, _, pace = where.partition(",pace:")
    if where.endswith(",join"):
        where = where[: -len(",join")]
        _kill_when_joined(marker + ".join")
    if pace:
        import time

        import torch

        def paced(original):
            def step(*args, **kwargs):
                time.sleep(float(pace))  # a run long enough for a new worker to start and join
                return original(*args, **kwargs)

            return step

        torch.optim.SGD.step = paced(torch.optim.SGD.step)
    kind, at = where.split(":")
    if kind == "step":
        import torch

        torch.optim.SGD.step = _kill_at(torch.optim.SGD.step, int(at), rank, marker)
    else:
        from hvdkit.torch import elastic

        elastic.State.save = _kill_at(elastic.State.save, int(at), rank, marker)
    sys.argv = [script, *args]
    sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
    runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    main()

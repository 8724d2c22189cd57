"""Run a training example under `hvdkit run --recovery in-process`; SIGKILL the process that is rank R
when it reaches a point, once per job (or, with term:N, send SIGTERM to the job's `hvdkit run`).

    kill_in_process.py MARKER R step:N SCRIPT [ARGS...]     # at its N-th optimizer step (SGD.step)
    kill_in_process.py MARKER R commit:N SCRIPT [ARGS...]   # inside its N-th commit (hk.elastic.State.save)
    kill_in_process.py MARKER R step:N,pace:S SCRIPT ...    # and every optimizer step of every process sleeps S s
    kill_in_process.py MARKER R step:N,join SCRIPT ...      # and the first worker that joins later, right after a
                                                            # rendezvous took its slot (MARKER.join): the others
                                                            # are then forming the ring with it, inside hvd.init
    kill_in_process.py MARKER R step:N,hold-for-join,pace:S ...  # and after the kill, a process training alone
                                                            # waits at its commits (at most 300 s) until the driver
                                                            # has told it of a worker to add, so a new worker that is
                                                            # slow to start (a loaded machine) still joins mid-run
    kill_in_process.py MARKER R term:N SCRIPT [ARGS...]     # at its N-th optimizer step, SIGTERM to the `hvdkit run`
                                                            # above it, as a scheduler preempting the job sends it
    kill_in_process.py MARKER R step:N,term-at-reset ...    # and at the survivors' reset after the kill, SIGTERM to
                                                            # the `hvdkit run` (MARKER.term)

MARKER is a file made with O_EXCL by the process that kills itself, so exactly one process of the job
is killed: a worker that joins later (or the same rank after a recovery) runs unharmed. The example
itself is unchanged: the kill wraps the framework's own step, or hvdkit's commit.
"""

import os
import runpy
import signal
import sys


def _hvdkit_run_above(pid):
    """The nearest process above ``pid`` that is `hvdkit run` (its argv: ... hvdkit run ...), from /proc."""
    while pid > 1:
        with open(f"/proc/{pid}/stat") as f:
            pid = int(f.read().rsplit(")", 1)[1].split()[1])
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = f.read().decode().split("\0")
        if any(os.path.basename(a) == "hvdkit" and argv[i + 1 : i + 2] == ["run"] for i, a in enumerate(argv)):
            return pid
    raise RuntimeError("kill_in_process: no `hvdkit run` above this process")


def _kill_self():
    os.kill(os.getpid(), signal.SIGKILL)


def _below(pid):
    """Every process below ``pid``, from /proc."""
    children = {}
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{entry}/stat") as f:
                children.setdefault(int(f.read().rsplit(")", 1)[1].split()[1]), []).append(int(entry))
        except (OSError, ValueError, IndexError):
            continue
    found, todo = [], list(children.get(pid, []))
    while todo:
        found.append(todo.pop())
        todo += children.get(found[-1], [])
    return found


def _term_hvdkit_run():
    """SIGTERM to the job's `hvdkit run`, after saying which processes run below it (the test checks that none
    is left once the job has ended)."""
    launcher = _hvdkit_run_above(os.getpid())
    below = " ".join(map(str, sorted(_below(launcher))))
    print(f"kill_in_process: SIGTERM to hvdkit run {launcher}; below it: {below}", flush=True)
    os.kill(launcher, signal.SIGTERM)


def _kill_at(original, at, rank, marker, act=_kill_self):
    calls = {"n": 0}

    def wrapped(*args, **kwargs):
        import horovod.torch as hvd

        calls["n"] += 1
        if calls["n"] >= at and hvd.rank() == rank and not os.path.exists(marker):
            try:
                os.close(os.open(marker, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
            except FileExistsError:
                return original(*args, **kwargs)
            if isinstance(getattr(args[0], "param_groups", None), list):  # what this rank's optimizer steps (ZeRO-1:
                held = sum(p.numel() for g in args[0].param_groups for p in g["params"])  # its slice only)
                print(f"kill_in_process: at step {calls['n']} the optimizer steps {held} parameter values", flush=True)
            act()
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


def _hold_for_join(marker):
    """After the kill (``marker`` exists), a process that trains alone waits at each commit's host check until
    Horovod's driver has told it of a host update (a new worker ready to join), at most 300 s: the run cannot
    end before the join it is meant to show. Before, the steps were only paced, and under a load of 14 a new
    worker took longer to start than the survivor took to train to the end."""
    import time

    import horovod.torch as hvd

    from hvdkit.torch import elastic

    original = elastic.State.check_host_updates

    def held(self):
        if os.path.exists(marker) and hvd.size() == 1:
            deadline = time.monotonic() + 300
            while self._messages.empty() and time.monotonic() < deadline:
                time.sleep(0.05)
        return original(self)

    elastic.State.check_host_updates = held


def _term_at_reset(marker):
    """At the first in-process reset of the job (a lost worker: the survivors form the ring again), SIGTERM to the
    job's `hvdkit run`, which passes it to every worker at once: it reaches this process between two trainings'
    PreemptionGuards. Then wait (at most 10 s) until hvdkit holds the signal for the next guard, and reset."""
    import time

    from hvdkit.core import preemption
    from hvdkit.torch import elastic

    original = elastic._reset

    def term_then_reset(*args, **kwargs):
        try:
            os.close(os.open(marker, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
        except FileExistsError:
            return original(*args, **kwargs)
        _term_hvdkit_run()
        deadline = time.monotonic() + 10
        while not getattr(preemption, "_held", None) and time.monotonic() < deadline:
            time.sleep(0.01)  # without a handler, SIGTERM's default action ends this process here
        return original(*args, **kwargs)

    elastic._reset = term_then_reset


def main():
    marker, rank, where, script, args = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5:]
    # every process of the job says it started (a joining worker too): its output reaches the job's
    print(f"kill_in_process: process {os.getpid()} runs {os.path.basename(script)}", flush=True)
    where, _, pace = where.partition(",pace:")
    if where.endswith(",join"):
        where = where[: -len(",join")]
        _kill_when_joined(marker + ".join")
    if where.endswith(",hold-for-join"):
        where = where[: -len(",hold-for-join")]
        _hold_for_join(marker)
    if where.endswith(",term-at-reset"):
        where = where[: -len(",term-at-reset")]
        _term_at_reset(marker + ".term")
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
    if kind in ("step", "term"):
        import torch

        act = _term_hvdkit_run if kind == "term" else _kill_self
        torch.optim.SGD.step = _kill_at(torch.optim.SGD.step, int(at), rank, marker, act)
    else:
        from hvdkit.torch import elastic

        elastic.State.save = _kill_at(elastic.State.save, int(at), rank, marker)
    sys.argv = [script, *args]
    sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
    runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    main()

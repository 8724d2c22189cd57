"""What the Horovod elastic test scripts share: the job's output folder and the discovery file.

``OUT/hosts`` is what the test's host discovery script prints (``cat OUT/hosts``); a script changes it
with :func:`set_hosts`, atomically, and leaves a marker file so that every rank (and the test) sees
which event happened.
"""

import os
import sys
import time

OUT = sys.argv[1]
STEPS_TO_SEE_THE_ADD = 4  # paced steps after the add in which the commit alone usually sees it
JOIN_WAIT_S = 300.0


def path(name):
    """``OUT/name``."""
    return os.path.join(OUT, name)


def happened(marker):
    """Whether the event ``marker`` happened (its file exists)."""
    return os.path.exists(path(marker))


def mark(marker):
    """Record that the event ``marker`` happened."""
    open(path(marker), "w").close()


def set_hosts(text, marker):
    """Make host discovery print ``text`` from now on, then mark ``marker``."""
    with open(path("hosts.tmp"), "w") as f:
        f.write(text)
    os.replace(path("hosts.tmp"), path("hosts"))
    mark(marker)


def wait_for_the_join(state, size):
    """Hold the survivor, at 1 rank after the removed host was added back, until Horovod tells it so.

    The scripts pace each step by 0.5 s while an event is pending, so that host discovery sees it and
    the driver tells rank 0 before the epochs run out: usually within a step or two, and the commit
    after a step raises HostsUpdatedInterrupt. On a loaded machine (load 10, the full suite beside
    another run) the survivor once trained to the end first: the worker started on the added host
    waited 120 s for it in the rendezvous and the job failed. So after ``STEPS_TO_SEE_THE_ADD`` paced
    steps, right after a commit (the values are then the committed ones), wait for the update with
    Horovod's own ``state.check_host_updates()``, which raises HostsUpdatedInterrupt once it came;
    at most ``JOIN_WAIT_S`` s, then say so and go on (the test then fails on its events)."""
    if size != 1 or not happened("added") or happened("killed"):
        return
    if state.steps < getattr(state, "added_after", 0) + STEPS_TO_SEE_THE_ADD:
        return
    t0 = time.monotonic()
    while time.monotonic() - t0 < JOIN_WAIT_S:
        state.check_host_updates()
        time.sleep(0.5)
    print(f"the host added back was not reported to rank 0 within {JOIN_WAIT_S:.0f} s", file=sys.stderr, flush=True)

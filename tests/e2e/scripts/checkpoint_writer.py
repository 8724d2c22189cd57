"""Saves checkpoints into DIR (no MPI: one process), for tests that SIGKILL it.

    checkpoint_writer.py DIR PAUSE      saves steps n+1, n+2, ... until killed
    checkpoint_writer.py DIR resave K   saves step 5, then saves step 5 again and kills itself
                                        right before the K-th file-system operation of that save

Each payload is derived from its step (and copy), so a reader can check it. In the first mode,
before each rename of a finished temporary folder into place it prints RENAMING and sleeps PAUSE
seconds: a test kills it there to hit the window between the write and the rename. In the second,
every rename, fsync, mkdir, unlink and rmdir of the second save (its deletions in the background
thread included) is a kill point; it prints DONE and the number of operations when K is past them.
"""

import hashlib
import itertools
import os
import signal
import sys
import threading
import time

from hvdkit.core import CheckpointStore, LocalCommunicator

RESAVED_STEP = 5
KILL_POINT_OPS = ("rename", "replace", "fsync", "mkdir", "unlink", "rmdir")


def payload(step, copy=0):
    block = hashlib.sha256(f"{step}/{copy}".encode() if copy else str(step).encode()).digest()
    return block * (1 << 15)  # 1 MiB


def writer(step, copy=0):
    def write(folder):
        with open(os.path.join(folder, "state.bin"), "wb") as f:
            f.write(payload(step, copy))

    return write


def saves_until_killed(root, pause):
    store = CheckpointStore(root, LocalCommunicator(), keep=3)
    real_rename = os.rename

    def slow_rename(src, dst):
        if os.path.basename(src).startswith(".tmp-") and "-ckpt-" in os.path.basename(src):  # a finished write
            print("RENAMING", flush=True)
            time.sleep(pause)
        real_rename(src, dst)

    os.rename = slow_rename
    newest = store.latest()
    for step in itertools.count((newest.step if newest else 0) + 1):
        store.save(writer(step), step, step)
        print(f"SAVED {step}", flush=True)


def arm(kill_at):
    """Make the ``kill_at``-th file-system operation from now (any thread) SIGKILL the process."""
    count = itertools.count(1)
    guard = threading.Lock()

    def patch(name):
        real = getattr(os, name)

        def op(*args, **kwargs):
            with guard:
                n = next(count)
            if n == kill_at:
                print(f"KILLED before operation {n}: {name} {args[0] if args else ''}", flush=True)
                os.kill(os.getpid(), signal.SIGKILL)
            return real(*args, **kwargs)

        setattr(os, name, op)

    for name in KILL_POINT_OPS:
        patch(name)
    return count


def resave_and_die(root, kill_at):
    store = CheckpointStore(root, LocalCommunicator(), keep=1)
    store.save(writer(RESAVED_STEP), RESAVED_STEP, 1)
    store.wait_for_cleanup()
    print(f"SAVED {RESAVED_STEP}", flush=True)
    count = arm(kill_at)
    store.save(writer(RESAVED_STEP, copy=1), RESAVED_STEP, 1)
    store.wait_for_cleanup()
    print(f"DONE after {next(count) - 1} operations", flush=True)


def main():
    if sys.argv[2] == "resave":
        resave_and_die(sys.argv[1], int(sys.argv[3]))
    else:
        saves_until_killed(sys.argv[1], float(sys.argv[2]))


if __name__ == "__main__":
    main()

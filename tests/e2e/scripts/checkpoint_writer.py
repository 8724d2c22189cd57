"""Saves checkpoints of steps n+1, n+2, ... into DIR until killed (no MPI: one process).

    checkpoint_writer.py DIR PAUSE

Each payload is derived from its step, so a reader can check it. Before each rename of a finished
temporary folder into place it prints RENAMING and sleeps PAUSE seconds: a test kills it there to
hit the window between the write and the rename.
"""

import hashlib
import itertools
import os
import sys
import time

from hvdkit.core import CheckpointStore, LocalCommunicator


def payload(step):
    block = hashlib.sha256(str(step).encode()).digest()
    return block * (1 << 15)  # 1 MiB


def main():
    root, pause = sys.argv[1], float(sys.argv[2])
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

        def write(folder, step=step):
            with open(os.path.join(folder, "state.bin"), "wb") as f:
                f.write(payload(step))

        store.save(write, step, step)
        print(f"SAVED {step}", flush=True)


if __name__ == "__main__":
    main()

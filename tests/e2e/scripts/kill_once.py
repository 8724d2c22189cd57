"""Run a training example, but on rank 1 of the first launch SIGKILL the process at training step N.

    kill_once.py N examples/torch_digits.py [ARGS...]

Used under `hvdkit run --max-restarts 1`: the restarted job (HVDKIT_RESTART=1) runs unharmed and
resumes from the newest checkpoint. The kill is injected by wrapping the framework's own step
(torch's SGD.step, Keras' per-batch callback hook), so the example itself is unchanged.
"""

import os
import runpy
import signal
import sys

from hvdkit.core import env
from hvdkit.core.topology import from_env


def _counting(original, at):
    calls = {"n": 0}

    def wrapped(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == at:
            os.kill(os.getpid(), signal.SIGKILL)
        return original(*args, **kwargs)

    return wrapped


def main():
    at, script, args = int(sys.argv[1]), sys.argv[2], sys.argv[3:]
    if from_env().rank == 1 and os.environ.get(env.RESTART, "0") == "0":
        if "torch" in os.path.basename(script):
            import torch

            torch.optim.SGD.step = _counting(torch.optim.SGD.step, at)
        else:
            from keras.src.callbacks.callback_list import CallbackList

            CallbackList.on_train_batch_end = _counting(CallbackList.on_train_batch_end, at)
    sys.argv = [script, *args]
    sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
    runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    main()

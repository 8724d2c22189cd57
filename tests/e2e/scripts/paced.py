"""Run a torch training example with every optimizer step lasting at least S seconds (a sleep after SGD.step).

    paced.py S examples/torch_digits.py [ARGS...]

A test that signals a job "mid-run" needs the run to last, whatever the machine's speed: pacing by a sleep
keeps the maths of the example unchanged (the parameters are bitwise those of an unpaced run).
"""

import os
import runpy
import sys
import time


def main():
    seconds, script, args = float(sys.argv[1]), sys.argv[2], sys.argv[3:]
    import torch

    original = torch.optim.SGD.step

    def paced(*a, **kw):
        result = original(*a, **kw)
        time.sleep(seconds)
        return result

    torch.optim.SGD.step = paced
    sys.argv = [script, *args]
    sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
    runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    main()

"""A rank program for timeline tests: STEPS rounds of three named allreduces of known sizes.

    timeline_job.py STEPS

Each step allreduces (sum) float32 tensors named ``tl.small`` (16 values), ``tl.medium`` (4096)
and ``tl.large`` (262144), rank r contributing r + 1, and checks the result; horovod.torch
records them as ``allreduce.tl.small`` etc. Rank 0 prints one JSON line of what was done.
Env: HOROVOD_TIMELINE (set by ``hvdkit run --timeline``) and the rank variables of the launcher.
"""

import json
import sys
import time

import horovod.torch as hvd
import torch

SIZES = {"tl.small": 16, "tl.medium": 4096, "tl.large": 262144}


def main():
    steps = int(sys.argv[1])
    hvd.init()
    expected = hvd.size() * (hvd.size() + 1) / 2
    for step in range(steps):
        handles = {
            name: hvd.allreduce_async(torch.full((n,), float(hvd.rank() + 1)), name=name, op=hvd.Sum)
            for name, n in SIZES.items()
        }
        for name, handle in handles.items():
            out = hvd.synchronize(handle)
            if not bool(torch.all(out == expected)):
                sys.exit(f"step {step}: allreduce {name} gave {out[0].item()} instead of {expected}")
    # Horovod drops the timeline records still queued when it shuts down: let rank 0's writer catch up.
    time.sleep(0.5)
    if hvd.rank() == 0:
        print(json.dumps({"steps": steps, "size": hvd.size(), "sizes": SIZES}), flush=True)


if __name__ == "__main__":
    main()

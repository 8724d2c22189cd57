"""``horovod.run(fn, np=2)`` as users call it; prints one JSON line: the results, or the error raised.

    python hvd_run_fn.py {gloo,mpi} {sum,raise}

``sum``: every rank returns the sum over the ranks of (rank + 10). ``raise``: rank 1 raises
ValueError before its collective, rank 0 waits in the allreduce that can no longer complete.
"""

import json
import sys


def summed(offset):
    import horovod.torch as hvd
    import torch

    hvd.init()
    return float(hvd.allreduce(torch.tensor([float(hvd.rank() + offset)]), op=hvd.Sum))


def raises():
    import horovod.torch as hvd
    import torch

    hvd.init()
    if hvd.rank() == 1:
        raise ValueError("a bad value on rank one")
    return float(hvd.allreduce(torch.tensor([1.0]), op=hvd.Sum))


if __name__ == "__main__":  # horovod.run starts its workers with multiprocessing's spawn
    import horovod

    backend, mode = sys.argv[1:]
    kwargs = {"use_gloo": True} if backend == "gloo" else {"use_mpi": True}
    try:
        if mode == "sum":
            out = {"results": horovod.run(summed, args=(10,), np=2, **kwargs)}
        else:
            out = {"results": horovod.run(raises, np=2, **kwargs)}
    except Exception as e:  # noqa: BLE001 - reported to the test
        out = {"error": type(e).__name__, "message": str(e)}
    print(json.dumps(out), flush=True)

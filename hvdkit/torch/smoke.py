"""A 2-rank allreduce check, run by ``hvdkit doctor``: rank r contributes r+1."""

import sys

import torch

from . import init, rank, size
from ._engine import horovod_torch


def main():
    init()
    hvd = horovod_torch()
    got = hvd.allreduce(torch.tensor([float(rank() + 1)]), op=hvd.Sum, name="hvdkit.smoke").item()
    want = size() * (size() + 1) / 2
    if got != want:
        print(f"allreduce WRONG: got {got}, want {want}")
        return 1
    print(f"allreduce ok: sum over {size()} ranks = {got:g}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

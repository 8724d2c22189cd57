"""Rank 1 stops taking part in collectives (it sleeps); rank 0 waits in an allreduce."""

import time

import torch

import hvdkit.torch as hk
from hvdkit.torch._engine import horovod_torch

hk.init()
hvd = horovod_torch()
hvd.allreduce(torch.ones(1), name="hvdkit.test.warmup")
if hk.rank() == 1:
    time.sleep(600)
hvd.allreduce(torch.ones(1), name="hvdkit.test.skipped_by_rank1")

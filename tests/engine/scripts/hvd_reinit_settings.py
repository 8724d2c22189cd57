"""One process: Horovod started, shut down and started again (what an elastic reset does), with two tensors of
600 KB each allreduced together (one grouped allreduce) after each start.

    HOROVOD_CONTROLLER=gloo HOROVOD_CPU_OPERATIONS=gloo HOROVOD_LOG_LEVEL=trace python hvd_reinit_settings.py

Horovod fuses tensors queued together into one response while they fit its fusion threshold (128 MB unless
HOROVOD_FUSION_THRESHOLD says otherwise), so both starts should perform them as one. Horovod's trace log
(stdout) names the tensors of each response it performs ("Performing a, b"); the last line of stdout is one JSON line with
the sums, which must be the tensors themselves at one rank.
"""

import json

import horovod.torch as hvd
import torch


def allreduce_two(tag):
    tensors = [torch.full((150_000,), float(i + 1)) for i in range(2)]  # 600 KB each, 1.2 MB together
    out = hvd.grouped_allreduce(tensors, name=f"probe.{tag}", op=hvd.Sum)
    return [float(t[0]) for t in out]


hvd.init()
first = allreduce_two("first")
hvd.shutdown()
hvd.init()
second = allreduce_two("second")
hvd.shutdown()
print(json.dumps({"first": first, "second": second}))

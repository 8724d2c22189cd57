"""One process: a backward pass whose allreduces stop being accepted half-way (Horovod shut down from a tensor
hook between the two layers, as a lost worker shuts it down), then the optimizer used again after hvd.init().

    HOROVOD_CONTROLLER=gloo HOROVOD_CPU_OPERATIONS=gloo python hvd_torch_failed_backward.py

Prints one JSON line: the error of the backward pass, the errors of zero_grad() and of the next step (None:
none), and the largest difference between the parameters after that step and those of plain SGD from the same
start (one rank: the average is the gradient itself).
"""

import copy
import json
import os

import horovod.torch as hvd
import torch


def error(fn):
    try:
        fn()
        return None
    except Exception as e:
        return f"{type(e).__name__}: {e}"[:160]


hvd.init()
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 1))
reference = copy.deepcopy(model)
os.environ["HOROVOD_ELASTIC"] = "1"  # the optimizer hooks every gradient on one rank too, as in an elastic job
opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), named_parameters=model.named_parameters())
del os.environ["HOROVOD_ELASTIC"]
x = torch.ones(2, 4)
hidden = model[0](x)
hidden.register_hook(lambda grad: hvd.shutdown())  # the second layer's allreduces are queued, the first's refused
out = {"backward": error(lambda: model[1](hidden).sum().backward())}
out["zero_grad"] = error(opt.zero_grad)
hvd.init()


def step():
    opt.zero_grad()
    model(x).sum().backward()
    opt.step()


out["next_step"] = error(step)
plain = torch.optim.SGD(reference.parameters(), lr=0.1)
reference(x).sum().backward()
plain.step()
out["max_diff_vs_plain_sgd"] = max(
    float((a - b).abs().max()) for a, b in zip(model.parameters(), reference.parameters())
)
print(json.dumps(out), flush=True)

"""Every rank of a 2-rank job: a Horovod script with a channels_last convolutional model (the memory
format GPU users pick for convolutions under AMP). Writes OUT/rank<r>.json.

Upstream each collective refused the model's tensors ("Tensor is required to be contiguous"):
broadcast_parameters, broadcast_optimizer_state and every step's gradient allreduce.
Usage: python hvd_torch_channels_last.py OUT
"""

import copy
import hashlib
import json
import sys
import traceback

import horovod.torch as hvd
import torch

STEPS = 3


def make_model(seed):
    torch.manual_seed(seed)
    net = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.ReLU(), torch.nn.Conv2d(8, 4, 3),
                              torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(4, 2))  # fmt: skip
    return net.to(memory_format=torch.channels_last)


def batches(size):
    g = torch.Generator().manual_seed(5)
    x = torch.randn(STEPS, size * 4, 3, 10, 10, generator=g)
    return x, torch.randn(STEPS, size * 4, 2, generator=g)


def digest(model):
    flat = torch.cat([p.detach().reshape(-1).double() for p in model.parameters()])
    return hashlib.sha256(flat.numpy().tobytes()).hexdigest()


def main():
    out = sys.argv[1]
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    rec = {}
    try:
        model = make_model(seed=rank)  # different on purpose: the broadcast must fix it
        rec["weight_is_channels_last"] = model[0].weight.is_contiguous(memory_format=torch.channels_last)
        rec["weight_is_contiguous"] = model[0].weight.is_contiguous()
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        rec["init_digest"] = digest(model)
        reference = copy.deepcopy(model)  # one process on the global batch
        ref_opt = torch.optim.SGD(reference.parameters(), lr=0.1, momentum=0.9)
        opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
                                       named_parameters=model.named_parameters())  # fmt: skip
        x, y = batches(size)
        mine = slice(rank * 4, (rank + 1) * 4)
        for s in range(STEPS):
            opt.zero_grad()
            torch.nn.functional.mse_loss(model(x[s][mine].contiguous(memory_format=torch.channels_last)), y[s][mine]).backward()
            opt.step()
            ref_opt.zero_grad()
            torch.nn.functional.mse_loss(reference(x[s].contiguous(memory_format=torch.channels_last)), y[s]).backward()
            ref_opt.step()
        rec["grad_keeps_its_format"] = model[0].weight.grad.is_contiguous(memory_format=torch.channels_last)
        rec["digest"] = digest(model)
        rec["max_diff_vs_reference"] = max((p - q).abs().max().item() for p, q in zip(model.parameters(), reference.parameters()))
        # momentum buffers exist now, in the parameters' memory format: broadcast them from rank 0
        state = opt.state_dict()["state"]
        rec["state_channels_last"] = any(not v["momentum_buffer"].is_contiguous() for v in state.values())
        hvd.broadcast_optimizer_state(opt, root_rank=0)
        rec["state_digest"] = hashlib.sha256(b"".join(
            v["momentum_buffer"].contiguous().numpy().tobytes() for _, v in sorted(opt.state_dict()["state"].items()))).hexdigest()
    except Exception as e:  # noqa: BLE001 - recorded for the test to show
        rec["error"] = f"{type(e).__name__}: {e}"
        rec["traceback"] = traceback.format_exc()
    with open(f"{out}/rank{rank}.json", "w") as f:
        json.dump(rec, f)


if __name__ == "__main__":
    main()

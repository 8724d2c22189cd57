"""Runs on every rank: what ZeRO-1 (``shard_optimizer_state=True``) really holds in memory, and its flat buffers.

``memory``: a model of one large parameter (``BIG`` fp32 elements) and a small head. For SGD with
momentum and for Adam, measured in this process's resident set (Linux ``VmRSS``/``VmHWM``, the peak
reset through ``/proc/self/clear_refs``, as ``hvdkit.bench.zero_bench`` does; glibc told to return
every allocation of 64 KiB or more at once, so that the resident set follows the live tensors): what building the
optimizer and ``WARM`` steps added to the resident set (the flat buffers replace the parameters and
gradients, so only the optimizer state should remain), and how far one more step raised the peak
above the resident set before it (the step's temporaries). Each rank's state bytes are recorded too.
``layout``: the structure that makes it so: parameters and gradients views of the flat buffers,
the inner optimizer's parameter a view of this rank's slice, ``zero_grad`` (both forms), a parameter
given new storage, a model cast after the optimizer was built (refused), a channels_last parameter.
Writes OUT/rank<r>.json.
"""

import ctypes
import gc
import json
import os
import sys

import torch

import hvdkit.torch as hk
from hvdkit.bench.zero_bench import proc_status, reset_peak
from hvdkit.core.errors import ConfigError

BIG = 1 << 23  # elements of the large parameter: 32 MiB of fp32
ROUND = 1 << 16  # round_elements for the step: 256 KiB of fp32 per round
WARM = 3


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.table = torch.nn.Parameter(torch.randn(BIG // 64, 64) * 0.01)
        self.head = torch.nn.Linear(64, 4)

    def forward(self, x):
        return self.head(self.table[x].mean(dim=1))


def exact_resident_set():
    """Make glibc serve every allocation of 64 KiB or more by mmap and return it to the system on free.

    By default glibc raises that threshold after a large free (up to 32 MiB), after which freed
    tensors stay resident and the resident set no longer follows what is allocated.
    """
    m_mmap_threshold = -3
    if ctypes.CDLL("libc.so.6").mallopt(m_mmap_threshold, 1 << 16) != 1:
        raise RuntimeError("mallopt(M_MMAP_THRESHOLD) refused")


def warm_up_engine():
    """Every collective kind once, so Horovod's own buffers (its fusion buffer) exist before measuring."""
    import horovod.torch as hvd

    small = [torch.ones(1 << 14) for _ in range(2)]
    hvd.grouped_allreduce(small, name="zero_memory.warm.ar")
    hvd.grouped_reducescatter(small, name="zero_memory.warm.rs")
    hvd.grouped_allgather(small, name="zero_memory.warm.ag")
    hvd.barrier()


def batch(rank, step):
    g = torch.Generator().manual_seed(100 * step + rank)
    return torch.randint(0, BIG // 64, (8, 16), generator=g), torch.randn(8, 4, generator=g)


def train_step(model, opt, rank, step):
    opt.zero_grad(set_to_none=False)
    x, y = batch(rank, step)
    torch.nn.functional.mse_loss(model(x), y).backward()
    opt.step()


def state_bytes(state):
    return sum(v.numel() * v.element_size() for s in state.values() for v in s.values() if torch.is_tensor(v))


def memory(kind, rank):
    """Resident growth from building the optimizer, and the peak of one step above the resident set before it."""
    torch.manual_seed(0)
    model = Net()
    x, y = batch(rank, 0)
    torch.nn.functional.mse_loss(model(x), y).backward()  # parameters and gradients exist, as in any run
    gc.collect()
    before = proc_status("VmRSS")
    inner = (
        torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        if kind == "sgd"
        else torch.optim.Adam(model.parameters(), lr=1e-3)
    )
    opt = hk.DistributedOptimizer(inner, model=model, shard_optimizer_state=True)
    opt.round_elements = ROUND
    for s in range(WARM):
        train_step(model, opt, rank, s)
    gc.collect()
    resident = proc_status("VmRSS")
    opt.zero_grad(set_to_none=False)
    x, y = batch(rank, WARM)
    torch.nn.functional.mse_loss(model(x), y).backward()
    gc.collect()
    start = proc_status("VmRSS")
    assert reset_peak(), "this kernel does not reset VmHWM (/proc/self/clear_refs)"
    opt.step()
    peak = proc_status("VmHWM")
    return {
        "param_bytes": BIG * 4,
        "state_bytes": state_bytes(opt.state),
        "resident_growth": resident - before,
        "step_peak_over_start": peak - start,
        "rounds": getattr(opt, "last_rounds", None),
    }


def layout(rank):
    torch.manual_seed(0)
    model = Net()
    held = list(model.parameters())
    opt = hk.DistributedOptimizer(
        torch.optim.Adam(model.parameters(), lr=1e-3), model=model, shard_optimizer_state=True
    )
    train_step(model, opt, rank, 0)
    (g,) = opt._groups
    base, gbase = g.flat.data_ptr(), g.grads.data_ptr()
    out = {
        "same_objects": all(a is b for a, b in zip(held, model.parameters(), strict=True)),
        "param_offsets": [(p.data_ptr() - base) // 4 for p in model.parameters()],
        "grad_offsets": [(p.grad.data_ptr() - gbase) // 4 for p in model.parameters()],
        "offsets": g.offsets[:-1],
        "inner_param_is_slice": [
            (q.data_ptr() - base) // 4 == g.slice.start and q.numel() == g.slice.stop - g.slice.start
            for group in opt._inner.param_groups
            for q in group["params"]
        ],
        "inner_grad_is_slice": (g.shard.grad.data_ptr() - gbase) // 4 == g.slice.start,
    }
    opt.zero_grad()  # set_to_none=True, torch's default
    out["none_after_zero_grad"] = all(p.grad is None for p in model.parameters())
    x, y = batch(rank, 1)
    torch.nn.functional.mse_loss(model(x), y).backward()
    out["grad_back_in_buffer"] = [(p.grad.data_ptr() - gbase) // 4 for p in model.parameters()] == g.offsets[:-1]
    out["grad_buffer_equals_grads"] = bool(
        torch.equal(g.grads, torch.cat([p.grad.reshape(-1) for p in model.parameters()]))
    )
    opt.step()
    # A parameter given new storage (same dtype): copied back into its place at the next step.
    model.head.bias.data = torch.full((4,), 0.25)
    opt.zero_grad(set_to_none=False)
    opt.step()
    out["new_storage_rebound"] = (model.head.bias.data_ptr() - base) // 4 == g.offsets[2]
    out["bias_after"] = model.head.bias.detach().tolist()
    model.double()
    try:
        opt.step()
        out["cast_refused"] = None
    except ConfigError as e:
        out["cast_refused"] = str(e)
    conv = torch.nn.Conv2d(3, 4, 3).to(memory_format=torch.channels_last)
    was = conv.weight.is_contiguous()
    copt = hk.DistributedOptimizer(torch.optim.SGD(conv.parameters(), lr=0.1), model=conv, shard_optimizer_state=True)
    value = conv.weight.detach().clone()
    out["channels_last"] = {
        "was_contiguous": was,
        "now_contiguous": conv.weight.is_contiguous(),
        "values_kept": bool(torch.equal(conv.weight.detach(), value)),
        "view_of_flat": conv.weight.data_ptr() == copt._groups[0].flat.data_ptr(),
    }
    return out


def main():
    out = sys.argv[1]
    exact_resident_set()
    hk.init()
    warm_up_engine()
    rank = hk.rank()
    memory("sgd", rank)  # once unmeasured: what a process allocates for good on its first steps is not the optimizer's
    result = {"size": hk.size(), "sgd": memory("sgd", rank), "adam": memory("adam", rank)}
    if sys.argv[2:] != ["memory-only"]:  # memory-only: what a build without the flat buffers can run
        result["layout"] = layout(rank)
    with open(os.path.join(out, f"rank{rank}.json"), "w", encoding="utf-8") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main()

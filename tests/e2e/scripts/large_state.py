"""Saves or restores a state of just over 2 GiB (fp32 model + SGD momentum) on every rank of a job.

    python large_state.py save|restore CKPT_DIR OUT

``save``: rank 0 fills the model and momentum with closed-form values and writes the checkpoint
(with a SHA-256 of every tensor). ``restore``, a fresh job: every rank starts as a fresh process
would (zeros, no momentum), restores, and records the same SHA-256, how long the restore took and
its peak memory.
Each rank writes OUT/<mode>-rank<r>.json.
The pytest side is tests/e2e/test_large_resume.py.
"""

import hashlib
import json
import os
import resource
import sys
import time

import torch

import hvdkit.torch as hk

# Two big fp32 parameters of odd sizes (neither a multiple of the 64 MiB chunk), a small fp16 one
# and an int64 buffer: 2 x 1,107,296,291 bytes of parameters and momentum, over 2 GiB in all.
BIG = 2**27 + 2**23 + 7
WIDE = (2**12, 2**15 + 3)


class Big(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Parameter(torch.empty(BIG))
        self.b = torch.nn.Parameter(torch.empty(WIDE))
        self.c = torch.nn.Parameter(torch.empty(5, dtype=torch.float16))
        self.register_buffer("count", torch.zeros((), dtype=torch.int64))


def fill(model, opt):
    """Closed-form values, in place (no second copy of a big tensor; no transcendental: cheap)."""
    with torch.no_grad():
        for i, p in enumerate(model.parameters()):
            torch.arange(p.numel(), out=p.view(-1)).mul_(1e-7 * (i + 1)).add_(1)
            buf = torch.empty_like(p)
            torch.arange(buf.numel(), out=buf.view(-1)).mul_(-3e-7 * (i + 1)).add_(2)
            opt.state[p]["momentum_buffer"] = buf
        model.count.fill_(1000)


def digest(model, opt):
    h = hashlib.sha256()
    for name, t in model.state_dict().items():
        h.update(name.encode())
        h.update(t.contiguous().view(-1).view(torch.uint8).numpy())
    for p in model.parameters():
        h.update(opt.state[p]["momentum_buffer"].contiguous().view(-1).view(torch.uint8).numpy())
    return h.hexdigest()


def anon_rss():
    """Bytes of this process's anonymous memory (not counting the page cache of a mapped file)."""
    with open("/proc/self/status", encoding="ascii") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("RssAnon:"))


def main(mode, ckpt_dir, out_dir):
    topo = hk.init()
    model = Big()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    ckpt = hk.Checkpointer(ckpt_dir, model, opt, keep=1)
    nbytes = sum(t.numel() * t.element_size() for t in model.state_dict().values()) * 2
    record = {"rank": topo.rank, "state_bytes": nbytes}
    if mode == "save":
        if topo.rank == 0:  # only rank 0's state is written; rank 1 keeps untouched (unallocated) pages
            fill(model, opt)
        t0 = time.perf_counter()
        ckpt.save(step=7, epoch=2, extra={"note": "big"})
        record["seconds"] = time.perf_counter() - t0
    else:  # a fresh start: zero pages, an optimizer without state
        record["before"] = {"count": int(model.count), "momentum_buffers": len(opt.state)}
        hk.communicator().barrier()
        t0 = time.perf_counter()
        resumed = ckpt.restore()
        record["seconds"] = time.perf_counter() - t0
        record["resumed"] = [resumed.step, resumed.epoch, resumed.extra]
    record["peak_rss_bytes"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    record["anon_rss_bytes"] = anon_rss()
    if mode == "restore" or topo.rank == 0:
        record["digest"] = digest(model, opt)
    with open(os.path.join(out_dir, f"{mode}-rank{topo.rank}.json"), "w") as f:
        json.dump(record, f)


if __name__ == "__main__":
    main(*sys.argv[1:4])

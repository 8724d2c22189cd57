"""An alpha-beta model of one data-parallel training step: compute, ring allreduce, fusion, overlap.

Framework-free and pure. A step on ``p`` ranks is simulated the way Horovod runs it:

- Forward takes ``(1 - backward_fraction) * compute_s``; the gradients then appear during the
  backward pass: ``head`` of the bytes at its start (layers whose backward is cheap and comes
  first, e.g. VGG-16's fully connected layers), the rest evenly over it. With ``overlap=False``
  (hvdkit's Keras adapter: ``apply`` averages after every gradient exists) they all appear at its end.
- One background thread (Horovod's) wakes every ``cycle_s``, takes every gradient byte ready by then
  up to ``fusion_bytes`` as one fused message and allreduces it before it looks again.
- A ring allreduce of ``n`` bytes costs ``2 (p - 1) / p * n / B + 2 (p - 1) * alpha``
  (``Link``: ``B`` bytes/s per rank's link, ``alpha`` seconds per ring hop).
- The step ends when both the backward pass and the last message are done; efficiency =
  ``share * compute_s / step_s``, where ``share`` (<= 1) is what ranks lose to sharing a host
  without communicating at all (the suite's ``compute_only`` ratio).

``efficiency`` is 1 for one rank, depends only on ``alpha`` with infinite bandwidth, and never
falls when the link gets faster (``tests/unit/benchmarks/test_scaling_model.py`` checks these).
"""

import math
from dataclasses import dataclass, replace

__all__ = [
    "GBIT",
    "Link",
    "Step",
    "allreduce_seconds",
    "efficiency",
    "simulate",
    "fit_link",
    "zero_memory",
    "zero_step",
]

GBIT = 1e9 / 8  # bytes/s in 1 Gbit/s


@dataclass(frozen=True)
class Link:
    """A rank's link: ``bytes_per_s`` (math.inf allowed) and ``alpha_s``, the latency of one ring hop."""

    bytes_per_s: float
    alpha_s: float = 0.0

    def __post_init__(self):
        if not self.bytes_per_s > 0:
            raise ValueError(f"bytes_per_s must be > 0 (got {self.bytes_per_s!r})")
        if not (self.alpha_s >= 0 and math.isfinite(self.alpha_s)):
            raise ValueError(f"alpha_s must be a finite number >= 0 (got {self.alpha_s!r})")

    @classmethod
    def gbit(cls, rate, alpha_s=0.0):
        """A link of ``rate`` Gbit/s."""
        return cls(rate * GBIT, alpha_s)


@dataclass(frozen=True)
class Step:
    """One rank's training step: gradient bytes, compute seconds and how Horovod moves the gradients.

    Defaults are Horovod 0.28's (fusion 128 MB, cycle 1 ms) with overlap on; ``share`` is the
    fraction of one process's speed a rank keeps when ranks share a host (1 for one rank per host).
    """

    grad_bytes: float
    compute_s: float
    backward_fraction: float = 2.0 / 3.0
    head: float = 0.0
    overlap: bool = True
    fusion_bytes: float = 128 * 2**20
    cycle_s: float = 1e-3  # > 0: Horovod's thread looks for ready gradients once per cycle
    share: float = 1.0

    def __post_init__(self):
        checks = {
            "grad_bytes": self.grad_bytes >= 0,
            "compute_s": self.compute_s > 0,
            "backward_fraction": 0 < self.backward_fraction <= 1,
            "head": 0 <= self.head <= 1,
            "fusion_bytes": self.fusion_bytes > 0,
            "cycle_s": self.cycle_s > 0,
            "share": 0 < self.share <= 1,
        }
        for name, ok in checks.items():
            if not ok:
                raise ValueError(f"{name} out of range (got {getattr(self, name)!r})")

    def with_(self, **changes):
        return replace(self, **changes)


def allreduce_seconds(nbytes, p, link):
    """Ring allreduce of ``nbytes`` over ``p`` ranks: ``2 (p-1)/p * n / B + 2 (p-1) alpha`` (0 for p = 1)."""
    if p <= 1 or nbytes <= 0:
        return 0.0
    return 2.0 * (p - 1) / p * nbytes / link.bytes_per_s + 2.0 * (p - 1) * link.alpha_s


def _ready(step, t):
    """Gradient bytes that exist at time ``t`` of the step (forward starts at 0)."""
    backward = step.compute_s * step.backward_fraction
    start = step.compute_s - backward
    if not step.overlap:
        return step.grad_bytes if t >= step.compute_s * (1 - 1e-12) else 0.0
    if t < start:
        return 0.0
    done = min(1.0, (t - start) / backward)
    return step.grad_bytes * (step.head + (1.0 - step.head) * done)


def _next_tick(t, cycle):
    """The first of Horovod's cycle ticks (every ``cycle`` seconds from the step's start) at or after ``t``."""
    return math.ceil(t / cycle - 1e-9) * cycle


def simulate(step, p, link):
    """``{"step_s", "comm_s", "messages", "exposed_s", "efficiency"}`` of ``step`` on ``p`` ranks over ``link``.

    Horovod's background thread looks for ready gradients at every cycle tick; at a tick it sends
    every byte ready (in messages of at most ``fusion_bytes``, one after the other), then waits for
    the next tick. Ticks fall every ``cycle_s`` from the start of the step.
    """
    if p < 1 or int(p) != p:
        raise ValueError(f"p must be an integer >= 1 (got {p!r})")
    if p == 1 or step.grad_bytes == 0:
        return {"step_s": step.compute_s, "comm_s": 0.0, "messages": 0, "exposed_s": 0.0, "efficiency": step.share}
    t = step.compute_s * (1 - step.backward_fraction) if step.overlap else step.compute_s
    sent, messages, comm, end = 0.0, 0, 0.0, 0.0
    tail = step.grad_bytes * 1e-12
    while sent < step.grad_bytes - tail:
        t = _next_tick(t, step.cycle_s)
        ready = _ready(step, t) - sent
        if ready <= tail:  # nothing new: sleep until the next tick
            t += step.cycle_s
            continue
        while ready > tail:
            message = min(ready, step.fusion_bytes)
            cost = allreduce_seconds(message, p, link)
            t += cost
            comm += cost
            sent += message
            ready -= message
            messages += 1
            end = t
    step_s = max(end, step.compute_s)
    return {
        "step_s": step_s,
        "comm_s": comm,
        "messages": messages,
        "exposed_s": step_s - step.compute_s,
        "efficiency": step.share * step.compute_s / step_s,
    }


def efficiency(step, p, link):
    """Scaling efficiency (time per step of one process / time per step on ``p`` ranks, weak scaling)."""
    return simulate(step, p, link)["efficiency"]


def fit_link(points, p):
    """``Link`` fitted to measured allreduces ``[(nbytes, seconds), ...]`` on ``p`` ranks (least squares).

    ``seconds = a + b * nbytes`` gives ``alpha = a / (2 (p-1))`` and ``B = 2 (p-1) / p / b``;
    a negative intercept is taken as 0.
    """
    if p < 2:
        raise ValueError(f"fit_link needs p >= 2 (got {p})")
    xs = [float(n) for n, _ in points]
    ys = [float(s) for _, s in points]
    if len(xs) < 2 or len(set(xs)) < 2:
        raise ValueError("fit_link needs allreduce times at two or more sizes")
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sum((x - mx) ** 2 for x in xs)
    a = my - b * mx
    if b <= 0:
        raise ValueError(f"allreduce times do not grow with size (slope {b:g} s/B): nothing to fit a bandwidth to")
    return Link(2.0 * (p - 1) / p / b, max(0.0, a) / (2.0 * (p - 1)))


def zero_memory(params, p, weight_bytes=4, grad_bytes=4, state_bytes=8, shard_copy_bytes=0, transient_bytes=0):
    """Bytes per rank of data-parallel training with and without ZeRO-1, ``{"plain", "sharded", "ratio"}``.

    Per parameter: weights, gradients and optimizer state (Adam in fp32: 4 + 4 + 8) on every rank
    unsharded; ZeRO-1 keeps the state of ``1/p`` of them only. ``shard_copy_bytes`` per parameter
    of the rank's slice are what an implementation keeps besides (hvdkit's ShardedOptimizer: a copy
    of the slice and its gradient, 8), ``transient_bytes`` per parameter what it allocates during a
    step (hvdkit's: the flat gradient, later the gathered parameters, 4): the peak, when given.
    """
    if not (isinstance(p, int) and p >= 1):
        raise ValueError(f"p must be an integer >= 1 (got {p!r})")
    if not params >= 0:
        raise ValueError(f"params must be >= 0 (got {params!r})")
    base = params * (weight_bytes + grad_bytes)
    plain = base + params * state_bytes
    sharded = base + params * (state_bytes + shard_copy_bytes) / p + params * transient_bytes
    return {"plain": plain, "sharded": sharded, "ratio": sharded / plain if plain else 1.0}


def zero_step(step, optimizer_s, p, link, comm_factor=1.0):
    """Seconds per step and efficiency, unsharded against ZeRO-1, ``{"plain": {...}, "sharded": {...}}``.

    ``step`` is forward + backward (``compute_s``) and its gradients; ``optimizer_s`` is one
    process's optimizer update of all parameters. Unsharded (Horovod's allreduce, overlapped with
    backward as ``simulate`` does) every rank updates everything after the last allreduce.
    ZeRO-1 as hvdkit runs it: the reduce-scatter starts after backward (no overlap), each rank
    updates ``1/p`` of the parameters, then the all-gather; the two move the bytes of one allreduce
    in a ring, so their cost is ``simulate``'s without overlap, times ``comm_factor`` (1 in the ring
    model; a measured time of reduce-scatter + all-gather over one allreduce of the same bytes
    otherwise). Efficiency is against one process with the unsharded optimizer (``share`` applied
    as in ``simulate``); ZeRO-1 can exceed 1 where the update is a large part of the step.
    """
    if not optimizer_s >= 0:
        raise ValueError(f"optimizer_s must be >= 0 (got {optimizer_s!r})")
    if not comm_factor > 0:
        raise ValueError(f"comm_factor must be > 0 (got {comm_factor!r})")
    single = step.compute_s + optimizer_s
    plain = simulate(step, p, link)["step_s"] + optimizer_s
    unlapped = simulate(step.with_(overlap=False), p, link)
    sharded = unlapped["step_s"] + (comm_factor - 1.0) * unlapped["comm_s"] + optimizer_s / p
    return {
        name: {"step_s": t, "efficiency": step.share * single / t}
        for name, t in (("plain", plain), ("sharded", sharded))
    }

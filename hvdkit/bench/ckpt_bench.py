"""Benchmark worker: hvdkit checkpoint save against plain ``torch.save`` (one process), and restore.

    python -m hvdkit.bench.ckpt_bench OUT.json [--quick]
    hvdkit run -np 2 -- python -m hvdkit.bench.ckpt_bench OUT.json --restore [--quick] [--megabytes N]
    python -m hvdkit.bench.ckpt_bench OUT.json --async [--quick] [--sizes 64,1024,2263] [--plot OUT.png]
        [--step-mb MB] [--step-reps N] [--free-core]

Variants, interleaved: ``torch_save`` (``torch.save`` to a file), ``torch_save_fsync`` (the same,
then ``fsync`` of the file and its folder: what durable means) and ``hvdkit`` (``Checkpointer.save``:
model + optimizer + RNG, written to a temporary folder, fsynced, hashed into a manifest, renamed
into place, old ones pruned in the background). Each variant's file is loaded back and compared
before timing. Every sample starts after ``os.sync()`` and after hvdkit's background deletion of
pruned checkpoints has finished (both untimed): what is timed is how long the training loop waits.
``--quick`` (checks, not figures) leaves out the ``os.sync()``: on a busy machine it waits for every other
process's writeback (about a minute beside the test suite's jobs, against 0.6 s for the whole run alone).

``--async`` (one process): ``Checkpointer.save`` with ``async_save=False`` (``sync``), with
``async_save=True`` but no torch optimizer to gate (``async_copy_in_save``: ``save()`` copies the whole
state, as every async save did before the copy left it) and with the model's SGD (``async``: the write
thread copies the parameters while training goes on), at each of ``--sizes`` megabytes, interleaved.
A sample is the time ``save()`` blocks the caller; for ``async`` also one forward and backward of the
saved model run during the copy and the time the next ``opt.step()`` then waited for the copy (beside
the same forward and backward with nothing in flight), and the time until ``wait()`` returned. Then
the step time of a "training step" (a chain of small matmuls) while a background write of
``--step-mb`` (default: the largest size) is in flight, at each ``writer_priority`` through the page cache
and at "normal" and "idle" with ``direct_io=True`` (O_DIRECT), against the same steps with none,
interleaved write by write, with how long each write took under training. With
``--free-core`` the step times are measured twice: with torch's own thread count (the step keeps every
core busy: ``step_time``) and with torch threads 1 (``step_time_free_core``: the step leaves the other
cores free, as a GPU-bound job leaves its CPUs). Every checkpoint is restored into a fresh model and
compared bitwise before anything is timed.

``--restore`` (every rank of a job): rank 0 writes one checkpoint of a model and its SGD momentum,
and the same state as one ``torch.save`` file, then, interleaved: ``torch_load`` (rank 0 alone:
``torch.load`` of that file and ``load_state_dict``
into the model and optimizer: what one process resuming pays), ``hvdkit`` (``Checkpointer.restore``
on every rank: verify, read on rank 0, tensors broadcast in chunks) and, with ``--pickled`` for
states under 2 GiB, ``pickled`` (what restore did before: ``torch.load`` on rank 0, the whole
state through one ``broadcast_object``, ``load_state_dict`` everywhere; minutes per GB and about
16x the state in memory on rank 0). A sample's time is the slowest rank's. The
file stays in the page cache between samples (nothing drops it): disk reads are not timed.
"""

import argparse
import hashlib
import json
import os
import shutil
import sys
import tempfile
import time

from .stats import Samples, check_close, interleaved

MEGABYTES = 64
QUICK_MEGABYTES = 1
RESTORE_MEGABYTES = 512  # model + momentum
PICKLE_LIMIT = 2**31 - 1  # Horovod's broadcast_object sends the pickle's size as an int32


def run(megabytes, reps, root):
    import torch

    import hvdkit.torch as hk
    from hvdkit.core.checkpoint import fsync_path
    from hvdkit.core.comm import LocalCommunicator

    side = int((megabytes * 2**20 / 4 / 2) ** 0.5)  # two square layers of fp32
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(side, side), torch.nn.Linear(side, side))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)  # no state: the payload is the model
    nbytes = sum(p.numel() * p.element_size() for p in model.parameters())
    ckpt = hk.Checkpointer(os.path.join(root, "hvdkit"), model, opt, keep=2, comm=LocalCommunicator())
    plain = os.path.join(root, "plain.pt")
    counter = iter(range(1, 10**6))

    def torch_save():
        torch.save({"model": model.state_dict(), "optimizer": opt.state_dict()}, plain)

    def torch_save_fsync():
        torch_save()
        fsync_path(plain)
        fsync_path(root, directory=True)

    def hvdkit_save():
        ckpt.save(step=next(counter), epoch=0)

    variants = {"torch_save": torch_save, "torch_save_fsync": torch_save_fsync, "hvdkit": hvdkit_save}
    want = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    checks = {}
    for name, fn in variants.items():
        fn()
        if name == "hvdkit":
            other = torch.nn.Sequential(torch.nn.Linear(side, side), torch.nn.Linear(side, side))
            hk.Checkpointer(os.path.join(root, "hvdkit"), other, comm=LocalCommunicator()).restore()
            got = torch.cat([p.detach().reshape(-1) for p in other.parameters()])
        else:
            state = torch.load(plain, weights_only=True)["model"]
            got = torch.cat([state[k].reshape(-1) for k in model.state_dict()])
        worst = float((got - want).abs().max()) if got.shape == want.shape else float("inf")
        checks[name] = check_close(f"checkpoint {name} read back", [worst], [0.0], 0.0)
    samples = {v: Samples() for v in variants}
    for rep, v in interleaved(list(variants), reps):
        # Untimed: no dirty pages left by the previous variant (its writeback would land on this
        # one's fsync), and no pruned checkpoint still being deleted in the background.
        ckpt.store.wait_for_cleanup()
        _settle()
        t0 = time.perf_counter()
        variants[v]()
        samples[v].add(time.perf_counter() - t0)
        if v == "hvdkit":
            print(f"[bench checkpoint] rep {rep + 1}/{reps} done", file=sys.stderr, flush=True)
    return {
        "payload_bytes": nbytes,
        "checks": checks,
        "variants": {v: s.as_dict() for v, s in samples.items()},
        "hvdkit_vs_torch_save_fsync": samples["hvdkit"].median / samples["torch_save_fsync"].median,
        "hvdkit_vs_torch_save": samples["hvdkit"].median / samples["torch_save"].median,
    }


def _restore_fixture(megabytes):
    """A model of two square fp32 layers and its SGD momentum, ``megabytes`` in all."""
    import torch

    side = int((megabytes * 2**20 / 4 / 4) ** 0.5)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(side, side), torch.nn.Linear(side, side))
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    for i, p in enumerate(model.parameters()):
        opt.state[p]["momentum_buffer"] = torch.full_like(p, 0.5 + i)
    return model, opt


def _tensors(model, opt):
    return [*model.state_dict().values(), *(opt.state[p]["momentum_buffer"] for p in model.parameters())]


def _digest(tensors):
    import torch

    h = hashlib.sha256()
    for t in tensors:
        h.update(t.detach().contiguous().reshape(-1).view(torch.uint8).numpy())
    return h.hexdigest()


def run_restore(megabytes, reps, root, with_pickled=False):
    """Restore on every rank of the job against ``torch.load`` on rank 0 alone (see the module doc)."""
    import torch

    import hvdkit.torch as hk

    comm = hk.communicator()
    model, opt = _restore_fixture(megabytes)
    tensors = _tensors(model, opt)
    nbytes = sum(t.numel() * t.element_size() for t in tensors)
    ckpt = hk.Checkpointer(os.path.join(root, "hvdkit"), model, opt, keep=1, comm=comm)
    ckpt.save(step=1, epoch=0)
    path = os.path.join(root, "plain.pt")  # the same state as one torch.save file: what torch_load reads
    if comm.is_rank0:
        torch.save({"model": model.state_dict(), "optimizer": opt.state_dict()}, path)
    comm.barrier()
    want = _digest(tensors)

    def load_into_model(state):
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])

    def torch_load():
        if comm.is_rank0:
            load_into_model(torch.load(path, map_location="cpu", weights_only=True))

    def pickled():
        state = torch.load(path, map_location="cpu", weights_only=True) if comm.is_rank0 else None
        load_into_model(comm.broadcast_object(state, name="hvdkit.bench.restore.pickled"))

    variants = {"torch_load": torch_load, "hvdkit": ckpt.restore}
    if with_pickled and nbytes < PICKLE_LIMIT * 0.9:  # the pickle is a little larger than the tensors
        variants["pickled"] = pickled
    checks = {}
    for name, fn in variants.items():
        with torch.no_grad():
            for t in _tensors(model, opt):
                t.zero_()
        fn()
        holds = comm.is_rank0 or name != "torch_load"
        ok = comm.allgather_object(
            _digest(_tensors(model, opt)) == want if holds else True, name="hvdkit.bench.restore.check"
        )
        checks[name] = check_close(f"restore {name}: every rank holds the saved state", [all(ok)], [True], 0)
    samples = {v: Samples() for v in variants}
    for rep, v in interleaved(list(variants), reps):
        comm.barrier()
        t0 = time.perf_counter()
        variants[v]()
        seconds = comm.allgather_object(time.perf_counter() - t0, name="hvdkit.bench.restore.seconds")
        samples[v].add(max(seconds))  # the job waits for its slowest rank
        if v == "hvdkit" and comm.is_rank0:
            print(f"[bench restore] rep {rep + 1}/{reps} done", file=sys.stderr, flush=True)
    return {
        "payload_bytes": nbytes,
        "ranks": comm.size,
        "checks": checks,
        "variants": {v: s.as_dict() for v, s in samples.items()},
        "gb_per_s": {v: nbytes / s.median / 1e9 for v, s in samples.items()},
        "hvdkit_vs_torch_load": samples["hvdkit"].median / samples["torch_load"].median,
        **({"pickled_vs_hvdkit": samples["pickled"].median / samples["hvdkit"].median} if "pickled" in samples else {}),
    }, comm.is_rank0


ASYNC_SIZES = (64, 1024, 2263)  # MB; 2263 MiB: the 2.21 GiB of the large-resume test
_SYNC_BEFORE_SAMPLES = True  # False under --quick (main)


def _settle():
    """Before a timed sample: ``os.sync()``, so that no writeback of the previous one lands on it (not with --quick)."""
    if _SYNC_BEFORE_SAMPLES:
        os.sync()


STEP_SIDE = 256  # the "training step": STEP_CHAIN matmuls of STEP_SIDE x STEP_SIDE fp32
STEP_CHAIN = 8


class _Layers:
    """Two square fp32 layers of ``megabytes`` in all, filled cheaply with known values."""

    def __init__(self, megabytes, salt=0.0):
        import torch

        side = int((megabytes * 2**20 / 4 / 2) ** 0.5)
        self.model = torch.nn.Sequential(*(torch.nn.Linear(side, side, device="meta") for _ in range(2)))
        self.model.to_empty(device="cpu")
        with torch.no_grad():
            for i, p in enumerate(self.model.parameters()):
                torch.arange(p.numel(), out=p.view(-1)).mul_(1e-7 * (i + 1)).add_(salt)
        self.opt = torch.optim.SGD(self.model.parameters(), lr=0.1)
        self.nbytes = sum(p.numel() * p.element_size() for p in self.model.parameters())

    def digest(self):
        return _digest(list(self.model.state_dict().values()))


def _matmul_step(a, b):
    for _ in range(STEP_CHAIN):
        a = (a @ b).tanh_()
    return a


ASYNC_MODES = ("sync", "async_copy_in_save", "async")


def _checkpointer(layers, root, mode, megabytes, writer_priority="normal", direct_io=False):
    """``sync``; ``async_copy_in_save``: no torch optimizer to gate, so ``save()`` copies everything (as every
    async save did before the copy left it); ``async``: the write thread copies the parameters while
    training goes on (the model's SGD has no state: the payload is the same)."""
    import hvdkit.torch as hk
    from hvdkit.core.comm import LocalCommunicator

    return hk.Checkpointer(
        os.path.join(root, f"{mode}-{megabytes}"),
        layers.model,
        layers.opt if mode == "async" else None,
        keep=2,
        comm=LocalCommunicator(),
        async_save=mode != "sync",
        writer_priority=writer_priority,
        direct_io=direct_io,
    )


class _StepWait:
    """Times how long ``opt.step()`` waited for the copy: from the call to the optimizer's own pre-hook
    (run after the process-wide hook that waits)."""

    def __init__(self, opt):
        self.opt, self.reached = opt, None
        opt.register_step_pre_hook(self._mark)

    def _mark(self, *_):
        self.reached = time.perf_counter()

    def step(self):
        t0 = time.perf_counter()
        self.opt.step()
        return self.reached - t0


def _forward_backward(model, batch):
    model(batch).square().mean().backward()


def _async_size(megabytes, reps, root):
    import torch

    import hvdkit.torch as hk
    from hvdkit.core.comm import LocalCommunicator

    layers = _Layers(megabytes)
    ckpts = {mode: _checkpointer(layers, root, mode, megabytes) for mode in ASYNC_MODES}
    counter = iter(range(1, 10**6))
    want, checks = layers.digest(), {}
    for mode, ckpt in ckpts.items():  # also the warm-up (the async variants' host copies are made once)
        ckpt.save(next(counter), 0)
        ckpt.wait()
        other = _Layers(megabytes, salt=1.0)
        hk.Checkpointer(ckpt.store.root, other.model, comm=LocalCommunicator()).restore()
        checks[mode] = check_close(f"{mode} checkpoint read back bitwise", [other.digest() == want], [True], 0)
        del other
    side = layers.model[0].in_features
    batch = torch.linspace(-1, 1, 4 * side).reshape(4, side)
    stepper = _StepWait(layers.opt)
    samples = {m: Samples() for m in ckpts}
    writes, fb_during, step_wait, fb_quiet = Samples(), Samples(), Samples(), Samples()
    for rep, mode in interleaved(list(ckpts), reps):
        ckpt = ckpts[mode]
        ckpt.store.wait_for_cleanup()
        _settle()  # untimed: no writeback of the previous sample lands on this one
        layers.opt.zero_grad(set_to_none=True)
        t0 = time.perf_counter()
        ckpt.save(next(counter), 0)
        samples[mode].add(time.perf_counter() - t0)
        if mode == "async":  # training goes on: one forward and backward of the model saved, then its step
            t1 = time.perf_counter()
            _forward_backward(layers.model, batch)
            fb_during.add(time.perf_counter() - t1)
            step_wait.add(stepper.step())
        ckpt.wait()
        if mode != "sync":
            writes.add(time.perf_counter() - t0)
        if mode == "sync":  # the same forward and backward with no copy or write in flight
            layers.opt.zero_grad(set_to_none=True)
            t1 = time.perf_counter()
            _forward_backward(layers.model, batch)
            fb_quiet.add(time.perf_counter() - t1)
        print(f"[bench checkpoint async] {megabytes} MB {mode} rep {rep + 1}/{reps}", file=sys.stderr, flush=True)
    layers.opt.zero_grad(set_to_none=True)
    for mode in ("sync", "async_copy_in_save"):
        ckpts[mode].store.close()
    torch.manual_seed(0)
    blocked = [a + b for a, b in zip(samples["async"].values, step_wait.values, strict=True)]
    return (
        layers,
        ckpts["async"],
        counter,
        {
            "payload_bytes": layers.nbytes,
            "checks": checks,
            "variants": {m: s.as_dict() for m, s in samples.items()},
            "async_whole_write": writes.as_dict(),
            "forward_backward_no_save": fb_quiet.as_dict(),
            "forward_backward_during_copy": fb_during.as_dict(),
            "next_step_waited_for_copy": step_wait.as_dict(),
            "async_blocked_with_step_wait": Samples(blocked).as_dict(),
            "blocked_async_vs_sync": samples["async"].median / samples["sync"].median,
            "blocked_copy_in_save_vs_sync": samples["async_copy_in_save"].median / samples["sync"].median,
        },
    )


def _steps_during_write(ckpt, counter, a, b, into):
    """Steps timed (into ``into``) while one background write is in flight; (steps, seconds the write took)."""
    ckpt.store.wait_for_cleanup()
    _settle()
    t0 = time.perf_counter()
    ckpt.save(next(counter), 0)
    steps = 0
    while ckpt.store.writing:
        t1 = time.perf_counter()
        _matmul_step(a, b)
        if ckpt.store.writing:  # the whole step ran during the write
            into.add(time.perf_counter() - t1)
            steps += 1
    took = time.perf_counter() - t0
    ckpt.wait()
    return steps, took


# The ways of writing timed side by side: name -> Checkpointer(writer_priority=..., direct_io=...). The three
# priorities write through the page cache (as in the records before O_DIRECT); "_direct": with O_DIRECT.
WRITERS = {
    "normal": ("normal", False),
    "normal_direct": ("normal", True),
    "low": ("low", False),
    "idle": ("idle", False),
    "idle_direct": ("idle", True),
}


def _step_times(ckpts, counter, reps, threads=None):
    """Step times while the background write of ``ckpt``'s state is in flight in each of ``WRITERS``' ways, and
    with none; interleaved. Also how long each write took under training, and the training time it cost
    (the steps during it minus as many steps without a write). ``threads``: torch's thread count for
    the steps (None: as it is); the count before is put back."""
    import torch

    before = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        return _timed_steps(ckpts, counter, reps)
    finally:
        torch.set_num_threads(before)


def _timed_steps(ckpts, counter, reps):
    import torch

    from ..core.checkpoint.background import WRITER_PRIORITIES

    a, b = torch.randn(STEP_SIDE, STEP_SIDE), torch.randn(STEP_SIDE, STEP_SIDE) / STEP_SIDE**0.5
    during = {w: Samples() for w in WRITERS}
    took, counts, quiet = {w: Samples() for w in WRITERS}, {w: [] for w in WRITERS}, Samples()
    for _ in range(reps):
        steps = 0
        for way in WRITERS:
            n, seconds = _steps_during_write(ckpts[way], counter, a, b, during[way])
            took[way].add(seconds)
            counts[way].append(n)
            steps = max(steps, n)
        for _ in range(max(steps, 20)):
            t0 = time.perf_counter()
            _matmul_step(a, b)
            quiet.add(time.perf_counter() - t0)
    out = {
        "step": f"{STEP_CHAIN} matmuls of {STEP_SIDE}x{STEP_SIDE} fp32, torch threads {torch.get_num_threads()}",
        "torch_threads": torch.get_num_threads(),
        "load_average": os.getloadavg(),
        "no_write": quiet.as_dict(),
    }
    for way, (priority, direct_io) in WRITERS.items():
        lost = sum(during[way].values) - len(during[way].values) * quiet.median
        out[way] = {
            "nice": WRITER_PRIORITIES[priority],
            "policy": "SCHED_IDLE" if priority == "idle" else "SCHED_OTHER",
            "direct_io": direct_io,
            "during_write": during[way].as_dict(),
            "step_time_during_vs_no_write": during[way].median / quiet.median if during[way].values else None,
            "write_took_under_training": took[way].as_dict(),
            "steps_per_write": counts[way],
            "training_time_lost_per_write_s": lost / reps,
        }
    return out


PIECES = {"before": (4 << 20, 0), "now": None}  # (piece size, hash lag; 0: unbounded) of the arrays writer


def _process_cpu():
    import resource

    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _pieces_compare(ckpt, counter, reps, nbytes):
    """The arrays writer's pieces as they were (4 MiB, the hash unbounded behind) against now, interleaved:
    a write alone (its wall and process CPU time per GiB), then a write under one-thread steps (their time
    during it against without)."""
    import torch

    from ..core.checkpoint import arrays

    now = (arrays._CHUNK, arrays._HASH_LAG)
    a, b = torch.randn(STEP_SIDE, STEP_SIDE), torch.randn(STEP_SIDE, STEP_SIDE) / STEP_SIDE**0.5
    wall, cpu, during = ({v: Samples() for v in PIECES} for _ in range(3))
    quiet, before_threads = Samples(), torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for _, v in interleaved(list(PIECES), reps):
            arrays._CHUNK, arrays._HASH_LAG = PIECES[v] or now
            ckpt.store.wait_for_cleanup()
            _settle()
            t0, c0 = time.perf_counter(), _process_cpu()
            ckpt.save(next(counter), 0)
            ckpt.wait()
            wall[v].add(time.perf_counter() - t0)
            cpu[v].add(_process_cpu() - c0)
            _steps_during_write(ckpt, counter, a, b, during[v])
            for _ in range(20):
                t1 = time.perf_counter()
                _matmul_step(a, b)
                quiet.add(time.perf_counter() - t1)
    finally:
        arrays._CHUNK, arrays._HASH_LAG = now
        torch.set_num_threads(before_threads)
    gib = nbytes / 2**30
    out = {"pieces": {v: list(PIECES[v] or now) for v in PIECES}, "no_write_1_thread": quiet.as_dict()}
    for v in PIECES:
        out[v] = {
            "write_wall": wall[v].as_dict(),
            "write_cpu_s_per_gib": [c / gib for c in cpu[v].values],
            "step_1_thread_during_write": during[v].as_dict(),
            "step_during_vs_no_write": during[v].median / quiet.median if during[v].values else None,
        }
    return out


def run_async(sizes, reps, root, step_reps=3, step_mb=None, free_core=False, pieces=False):
    """``--async``: blocked time of sync vs async saves per size, then step times during a write of ``step_mb``
    (with ``free_core``, also with the step on one torch thread)."""
    import torch

    out = {
        "sizes_mb": list(sizes),
        "reps": reps,
        "torch_threads": torch.get_num_threads(),
        "load_average_at_start": os.getloadavg(),
        "results": {},
    }
    for mb in sizes:
        layers, ckpt, counter, result = _async_size(mb, reps, root)
        out["results"][str(mb)] = result
        ckpt.store.close()
        del layers, ckpt
    layers = _Layers(step_mb or max(sizes))
    ckpts = {
        way: _checkpointer(layers, root, "async", f"steps-{way}", writer_priority=p, direct_io=d)
        for way, (p, d) in WRITERS.items()
    }
    out["o_direct_taken"] = _takes_o_direct(root)
    counter = iter(range(1, 10**6))
    out["step_time"] = {"payload_bytes": layers.nbytes, **_step_times(ckpts, counter, step_reps)}
    if free_core:
        out["step_time_free_core"] = {"payload_bytes": layers.nbytes, **_step_times(ckpts, counter, step_reps, 1)}
    if pieces:
        out["pieces_before_vs_now"] = {
            "payload_bytes": layers.nbytes,
            **_pieces_compare(ckpts["normal"], counter, step_reps, layers.nbytes),
        }
    for ckpt in ckpts.values():
        ckpt.store.close()
    out["load_average_at_end"] = os.getloadavg()
    return out


def _takes_o_direct(root):
    """Whether the file system under ``root`` takes O_DIRECT (else the "_direct" ways wrote through the page cache)."""
    from ..core.checkpoint.direct import open_direct

    probe = os.path.join(root, "o-direct-probe")
    opened = open_direct(probe)
    if opened is not None:
        opened.close()
    os.remove(probe)
    return opened is not None


def _how(priority_result):
    """A writer's way in a plot label: its nice value, or its policy where that is not the usual; O_DIRECT."""
    policy = priority_result.get("policy", "SCHED_OTHER")
    how = f"nice {priority_result['nice']}" if policy == "SCHED_OTHER" else policy
    return f"{how}\nO_DIRECT" if priority_result.get("direct_io") else how


def plot_async(result, path):
    """Blocked time per size (sync vs async, log scale) and the step-time ratio, as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sizes = list(result["results"])
    fig, (left, right) = plt.subplots(1, 2, figsize=(14, 4.5), gridspec_kw={"width_ratios": [1, 2]})
    for i, mode in enumerate(ASYNC_MODES):
        med = [result["results"][s]["variants"][mode]["median_s"] for s in sizes]
        left.bar([j + 0.27 * i for j in range(len(sizes))], med, width=0.27, label=mode)
    left.set_xticks([j + 0.27 for j in range(len(sizes))], [f"{s} MB" for s in sizes])
    left.set_yscale("log")
    left.set_ylabel("save() blocks training (s, median)")
    left.legend()
    st, bars = result["step_time"], {}
    for key, label in (("step_time", "all cores"), ("step_time_free_core", "1 thread")):
        if key in result:
            one = result[key]
            bars[f"no write\n{label}"] = one["no_write"]
            bars.update({f"{w}\n{_how(one[w])}\n{label}": one[w]["during_write"] for w in WRITERS if w in one})
    bars = {k: v for k, v in bars.items() if v.get("median_s") is not None}
    right.bar(list(bars), [v["median_s"] * 1e3 for v in bars.values()])
    right.tick_params(axis="x", labelsize=6)
    right.set_ylabel(f"step time (ms, median; {st['payload_bytes'] / 2**20:.0f} MB being written)")
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out")
    p.add_argument("--quick", action="store_true", help="1 MB, 1 repetition: checks, not figures")
    p.add_argument("--reps", type=int, default=7)
    p.add_argument(
        "--dir", default=None, help="where to write (default: a temporary folder); the disk is part of the result"
    )
    p.add_argument(
        "--restore", action="store_true", help="time restore on every rank of the job (start it with hvdkit run)"
    )
    p.add_argument("--pickled", action="store_true", help="with --restore: also time the previous restore path (slow)")
    p.add_argument("--async", dest="async_", action="store_true", help="sync vs async_save blocked time, step time")
    p.add_argument("--sizes", default=",".join(map(str, ASYNC_SIZES)), help="with --async: megabytes, comma-separated")
    p.add_argument("--plot", default=None, help="with --async: also write this PNG")
    p.add_argument("--step-mb", type=int, default=None, help="with --async: the write the steps are timed under")
    p.add_argument("--step-reps", type=int, default=3, help="with --async: writes timed per writer priority")
    p.add_argument(
        "--pieces",
        action="store_true",
        help="with --async: also the arrays writer's pieces as they were (4 MiB, hash unbounded) against now",
    )
    p.add_argument(
        "--free-core",
        action="store_true",
        help="with --async: also time the steps with torch threads 1 (the other cores free, as on a GPU node)",
    )
    p.add_argument(
        "--megabytes",
        type=int,
        default=None,
        help=f"state size (default: {MEGABYTES}, with --restore {RESTORE_MEGABYTES})",
    )
    args = p.parse_args(argv)
    megabytes = QUICK_MEGABYTES if args.quick else args.megabytes or (RESTORE_MEGABYTES if args.restore else MEGABYTES)
    reps = 1 if args.quick else args.reps
    root = tempfile.mkdtemp(prefix="hvdkit-bench-ckpt-", dir=args.dir)
    global _SYNC_BEFORE_SAMPLES
    sync_before = _SYNC_BEFORE_SAMPLES
    _SYNC_BEFORE_SAMPLES = not args.quick
    try:
        if args.async_:
            sizes = [QUICK_MEGABYTES] if args.quick else [int(v) for v in args.sizes.split(",")]
            step_reps = 1 if args.quick else args.step_reps
            result, writer = (
                run_async(
                    sizes,
                    reps,
                    root,
                    step_reps=step_reps,
                    step_mb=args.step_mb,
                    free_core=args.free_core,
                    pieces=args.pieces,
                ),
                True,
            )
        elif args.restore:
            result, writer = run_restore(megabytes, reps, root, args.pickled)
        else:
            result, writer = run(megabytes, reps, root), True
    finally:
        _SYNC_BEFORE_SAMPLES = sync_before
        shutil.rmtree(root, ignore_errors=True)
    if writer:
        with open(args.out, "w", encoding="utf-8") as f:
            json.dump(result, f, indent=1)
        if args.async_ and args.plot:
            plot_async(result, args.plot)


if __name__ == "__main__":
    main()

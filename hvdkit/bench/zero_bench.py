"""Benchmark worker: ZeRO-1 (``shard_optimizer_state=True``) against the unsharded optimizer, Adam.

    hvdkit run -np 2 -- python -m hvdkit.bench.zero_bench OUT.json [--quick]
    unshare -n sh -c 'ip link set lo up && exec "$@"' - \\
        hvdkit run -np 2 --gloo -- python -m hvdkit.bench.zero_bench OUT.json --part sharded [--quick]

The model is embedding-heavy (a 100,000 x 256 embedding, mean over the tokens, a small MLP head:
25.7 M parameters), so Adam's two moments (8 bytes a parameter) outweigh weights and gradients
together. Variants: ``plain`` (``hk.DistributedOptimizer(Adam)``: allreduce) and ``sharded``
(``shard_optimizer_state=True``: reduce-scatter, this rank's slice stepped, all-gather).

``--part time`` (default): both variants in this job, from one initial state; before timing both
train a few steps and must end bitwise equal across ranks and equal to each other (relative
1e-6), then they are timed interleaved (plain sharded plain sharded ...). Also measured: the
optimizer state bytes of each variant on each rank (from its state tensors), the bytes each hands
to the collectives per step, and what one process's step costs without communication
(forward+backward and Adam's update, every rank at once), for the scaling model.

``--part plain`` / ``--part sharded``: ONE variant in this process, so that its memory is its own:
the resident set after the model and its gradients exist, then its high-water mark (VmHWM, reset
by ``/proc/self/clear_refs``) over building the optimizer and ``steps`` steps. When the job runs in
a private network namespace (``lo`` is the only interface: what ``hvdkit bench`` makes with
``unshare -n``), the loopback's transmitted bytes over those steps are every byte this job put on
the wire; Horovod's idle control traffic, measured over an idle spell, is subtracted.

Rank 0 writes OUT.json.
"""

import argparse
import copy
import hashlib
import json
import sys
import time

import torch

from .stats import Samples, check_close, interleaved, ring_bytes_sent, timed

VOCAB, DIM, HIDDEN, CLASSES, BATCH, TOKENS = 100_000, 256, 512, 10, 32, 32
QUICK = {"vocab": 1000, "dim": 16, "hidden": 32, "batch": 4, "tokens": 4}
VARIANTS = ("plain", "sharded")
# Timed beside them in --part time: the sharded optimizer with its reduce-scatter left to step()
# (``overlap = False``), to measure what overlapping it with backward gains.
SERIAL = "sharded_serial"
CHECK_STEPS = 3
REL_TOL = 1e-6  # sharded vs plain: max |diff| / max |plain| after CHECK_STEPS (fp32 rounding)
LR = 1e-3


class Net(torch.nn.Module):
    """Embedding (``vocab`` x ``dim``, dense gradients) -> mean over the tokens -> Linear-ReLU-Linear."""

    def __init__(self, vocab, dim, hidden):
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, dim)
        self.head = torch.nn.Sequential(torch.nn.Linear(dim, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, CLASSES))

    def forward(self, x):
        return self.head(self.embed(x).mean(dim=1))


def proc_status(*keys):
    """``keys`` (VmRSS, VmHWM) of /proc/self/status in bytes: one value for one key, a tuple for several.

    Several keys come from one read of the file, so they describe one moment: the kernel computes
    VmHWM as at least VmRSS, which two separate reads do not keep (the resident set can grow between
    them: a run saw VmRSS a few pages above the VmHWM read just before)."""
    with open("/proc/self/status", encoding="utf-8") as f:
        found = {line.split(":", 1)[0]: int(line.split()[1]) * 1024 for line in f if line.split(":", 1)[0] in keys}
    missing = [k for k in keys if k not in found]
    if missing:
        raise KeyError(missing[0])
    values = tuple(found[k] for k in keys)
    return values[0] if len(keys) == 1 else values


def reset_peak():
    """Reset VmHWM to the current resident set (Linux >= 4.0); False where the kernel refuses."""
    try:
        with open("/proc/self/clear_refs", "w", encoding="utf-8") as f:
            f.write("5")
        return True
    except OSError:
        return False


def net_dev(text):
    """``{interface: (bytes received, bytes sent)}`` from the text of /proc/net/dev.

    Two header lines, then ``name: rx_bytes rx_packets ... (8 receive fields) tx_bytes ...``; a
    line that does not read so raises ValueError naming it.
    """
    out = {}
    for line in text.splitlines()[2:]:
        name, sep, fields = line.partition(":")
        values = fields.split()
        if not sep or len(values) < 16 or not all(v.isdigit() for v in values):
            raise ValueError(f"not a /proc/net/dev interface line: {line!r}")
        out[name.strip()] = (int(values[0]), int(values[8]))
    return out


def loopback():
    """(interfaces, bytes sent through ``lo`` or None) in this network namespace."""
    with open("/proc/net/dev", encoding="utf-8") as f:
        table = net_dev(f.read())
    return sorted(table), table["lo"][1] if "lo" in table else None


def private_netns():
    """True when ``lo`` is the only interface: its counters then see this job's traffic alone."""
    names, sent = loopback()
    return names == ["lo"] and sent is not None


class ZeroJob:
    def __init__(self, quick):
        import horovod.torch as hvd

        import hvdkit.torch as hk

        self.hvd, self.hk = hvd, hk
        hk.init(threads=1)
        self.rank, self.size = hvd.rank(), hvd.size()
        self.shape = (
            QUICK if quick else {"vocab": VOCAB, "dim": DIM, "hidden": HIDDEN, "batch": BATCH, "tokens": TOKENS}
        )
        g = torch.Generator().manual_seed(1000 + self.rank)
        s = self.shape
        self.x = torch.randint(0, s["vocab"], (s["batch"], s["tokens"]), generator=g)
        self.y = torch.randint(0, CLASSES, (s["batch"],), generator=g)

    def model(self):
        s = self.shape
        torch.manual_seed(0)
        return Net(s["vocab"], s["dim"], s["hidden"])

    def optimizer(self, variant, model):
        adam = torch.optim.Adam(model.parameters(), lr=LR)
        opt = self.hk.DistributedOptimizer(adam, model=model, shard_optimizer_state=variant != "plain")
        if variant == SERIAL:
            opt.overlap = False
        return opt

    def forward_backward(self, model):
        model.zero_grad(set_to_none=False)
        torch.nn.functional.cross_entropy(model(self.x), self.y).backward()

    def step_fn(self, model, opt):
        def step():
            self.forward_backward(model)
            opt.step()

        return step

    def flat(self, model):
        return torch.cat([p.detach().reshape(-1) for p in model.parameters()])

    def gather(self, value, name):
        """``value`` of every rank, in rank order (a Python object). Collective."""
        return self.hvd.allgather_object(value, name=f"bench.zero.{name}")

    def progress(self, msg):
        if self.rank == 0:
            print(f"[bench zero] {msg}", file=sys.stderr, flush=True)

    # ------------------------------------------------------------ --part time
    def check(self, models, steps):
        """Both variants after ``steps`` steps: bitwise equal across ranks, sharded equal to plain."""
        flats = {}
        for v, (step, model) in steps.items():
            for _ in range(CHECK_STEPS):
                step()
            flats[v] = self.flat(model)
            digests = self.gather(hashlib.sha256(flats[v].numpy().tobytes()).hexdigest(), f"digest.{v}")
            if len(set(digests)) != 1:
                check_close(f"{v} parameters across ranks (digests {digests})", [1.0], [0.0], 0.0)
        plain, sharded = flats["plain"], flats["sharded"]
        scale = float(plain.abs().max())
        rel = float((sharded - plain).abs().max()) / scale
        check_close("sharded vs plain parameters (relative)", [rel], [0.0], REL_TOL)
        checks = {"plain_across_ranks": 0.0, "sharded_across_ranks": 0.0, "sharded_vs_plain_rel": rel}
        if SERIAL in flats:  # the overlap reorders no arithmetic: bitwise the same parameters
            serial = float((flats[SERIAL] - sharded).abs().max())
            check_close("sharded with vs without overlap (absolute)", [serial], [0.0], 0.0)
            checks["overlap_vs_serial"] = serial
        return checks

    def compute_only(self, reps, iters):
        """Seconds of forward+backward and of Adam's update alone, every rank at once, no communication."""
        model = self.model()
        adam = torch.optim.Adam(model.parameters(), lr=LR)
        self.forward_backward(model)
        adam.step()
        self.hvd.barrier()
        fb = Samples(timed(lambda: self.forward_backward(model), iters) for _ in range(reps))
        upd = Samples(timed(adam.step, iters) for _ in range(reps))
        return {"forward_backward_s": fb.median, "adam_step_s": upd.median}

    def comm_only(self, params, reps):
        """Seconds of one allreduce of the flat gradient against its reduce-scatter + all-gather, interleaved."""
        hvd = self.hvd
        flat = torch.ones(params)

        def allreduce():
            hvd.allreduce(flat, name="bench.zero.comm.ar")

        def rs_ag():
            part = hvd.reducescatter(flat, name="bench.zero.comm.rs")
            hvd.allgather(part, name="bench.zero.comm.ag")

        fns = {"allreduce": allreduce, "reducescatter_allgather": rs_ag}
        samples = {k: Samples() for k in fns}
        for _, k in interleaved(list(fns), reps + 1):
            hvd.barrier()
            samples[k].add(timed(fns[k], 1))
        return {k: Samples(s.values[1:]).as_dict() for k, s in samples.items()}  # the first: warm-up

    def run_time(self, reps, iters):
        timed_variants = (*VARIANTS, SERIAL)
        base = self.model()
        models = {v: copy.deepcopy(base) for v in timed_variants}
        opts = {v: self.optimizer(v, models[v]) for v in timed_variants}
        steps = {v: (self.step_fn(models[v], opts[v]), models[v]) for v in timed_variants}
        checks = self.check(models, steps)
        self.progress(f"checks passed: sharded vs plain relative {checks['sharded_vs_plain_rel']:.2g}")
        samples = {v: Samples() for v in timed_variants}
        for rep, v in interleaved(timed_variants, reps):
            self.hvd.barrier()
            samples[v].add(timed(steps[v][0], iters))
            if v == timed_variants[-1]:
                self.progress(f"rep {rep + 1}/{reps} done")
        from hvdkit.torch.zero import partition

        params = sum(p.numel() for p in base.parameters())
        grad_bytes = params * 4
        own = partition(params, self.size)[self.rank]  # one param group: this rank's slice
        mine = (own.stop - own.start) * 4
        state = {v: self.gather(state_bytes(opts[v].state), f"state.{v}") for v in VARIANTS}
        handed = {  # bytes per step this rank hands to the collectives (input, output)
            "plain": {"allreduce": [grad_bytes, grad_bytes]},
            "sharded": {
                "reducescatter": [grad_bytes, mine],
                "allgather": [mine, grad_bytes],
            },
        }
        return {
            "model": dict(self.shape, classes=CLASSES, parameters=params, grad_bytes=grad_bytes),
            "checks": checks,
            "steps_per_sample": iters,
            "variants": {
                v: {**samples[v].as_dict(), "samples_per_s": self.size * self.shape["batch"] / samples[v].median}
                for v in VARIANTS
            },
            "throughput_sharded_over_plain": samples["plain"].median / samples["sharded"].median,
            "overlap": {
                "serial": samples[SERIAL].as_dict(),
                "rounds": opts["sharded"].last_rounds,
                "speedup": samples[SERIAL].median / samples["sharded"].median,
            },
            "state_bytes_per_rank": state,
            "state_ratio": max(state["sharded"]) / max(state["plain"]),
            "collective_bytes_per_step": handed,
            "ring_bytes_sent_per_step": ring_formula(grad_bytes, self.size),
            "compute_only": self.compute_only(3, 2 if iters <= 1 else iters),
            "comm_only": self.comm_only(params, 1 if reps <= 1 else 5),
        }

    # ------------------------------------------------------------ --part plain|sharded
    def warm_up_engine(self):
        """Every collective kind once on small fused tensors: Horovod's own buffers (fusion buffer,
        Gloo/MPI contexts) exist before the baseline, so neither variant is charged for them."""
        hvd = self.hvd
        small = [torch.ones(1 << 14) for _ in range(2)]
        hvd.grouped_allreduce(small, name="bench.zero.warm.ar")
        hvd.grouped_reducescatter(small, name="bench.zero.warm.rs")
        hvd.grouped_allgather(small, name="bench.zero.warm.ag")
        hvd.barrier()

    def run_one(self, variant, steps):
        """One variant in this process: resident memory, its peak, wire bytes and time over ``steps`` steps."""
        private = private_netns()
        model = self.model()
        self.forward_backward(model)  # weights and gradients exist: what both variants hold anyway
        self.warm_up_engine()
        rss_model = proc_status("VmRSS")
        resettable = reset_peak()
        opt = self.optimizer(variant, model)
        step = self.step_fn(model, opt)
        step()  # the optimizer state exists from here on
        self.hvd.barrier()
        sent0, t0 = loopback()[1], time.perf_counter()
        for _ in range(steps):
            step()
        self.hvd.barrier()
        sent1, t1 = loopback()[1], time.perf_counter()
        time.sleep(0.5)  # Horovod's background threads keep talking while idle: their rate, subtracted
        sent2, t2 = loopback()[1], time.perf_counter()
        peak, end = proc_status("VmHWM", "VmRSS")  # one moment: peak >= end
        mine = {
            "rss_model_bytes": rss_model,
            "peak_rss_bytes": peak,
            "rss_end_bytes": end,
            "state_bytes": state_bytes(opt.state),
            "peak_reset": resettable,
        }
        ranks = self.gather(mine, f"memory.{variant}")
        out = {
            "variant": variant,
            "steps": steps,
            "step_s": (t1 - t0) / steps,
            "ranks": ranks,
            "peak_growth_bytes": [r["peak_rss_bytes"] - r["rss_model_bytes"] for r in ranks],
            "private_netns": private,
        }
        if private:
            idle_rate = (sent2 - sent1) / (t2 - t1)
            payload = (sent1 - sent0) - idle_rate * (t1 - t0)
            out["wire"] = {
                "lo_bytes": sent1 - sent0,
                "raw_bytes_per_rank_per_step": (sent1 - sent0) / steps / self.size,
                "idle_bytes_per_s": idle_rate,
                "bytes_per_rank_per_step": payload / steps / self.size,
            }
        else:
            out["wire"] = None
            out["wire_note"] = "not in a private network namespace: lo counts other traffic too; not measured"
        return out


def state_bytes(state):
    """Bytes held by the tensors of an optimizer ``state``."""
    return sum(v.numel() * v.element_size() for s in state.values() for v in s.values() if hasattr(v, "numel"))


def ring_formula(grad_bytes, size):
    """Bytes one rank sends per step by the ring formulas: allreduce vs reduce-scatter + all-gather."""
    rs, ag = ring_bytes_sent("reducescatter", grad_bytes, size), ring_bytes_sent("allgather", grad_bytes, size)
    return {"plain": ring_bytes_sent("allreduce", grad_bytes, size), "sharded": rs + ag}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out")
    p.add_argument("--quick", action="store_true", help="tiny model, 1 repetition: checks, not figures")
    p.add_argument("--part", choices=("time", *VARIANTS), default="time", help="what this job measures (see above)")
    p.add_argument("--reps", type=int, default=7)
    p.add_argument("--steps", type=int, default=2, help="steps per timing sample (--part time), or measured (others)")
    args = p.parse_args(argv)
    job = ZeroJob(args.quick)
    t0 = time.perf_counter()
    if args.part == "time":
        result = job.run_time(1 if args.quick else args.reps, 1 if args.quick else args.steps)
    else:
        result = job.run_one(args.part, 2 if args.quick else max(args.steps, 5))
    result["seconds"] = time.perf_counter() - t0
    result["size"] = job.size
    if job.rank == 0:
        with open(args.out, "w", encoding="utf-8") as f:
            json.dump(result, f, indent=1)
        print(f"[bench zero] {args.part} done in {result['seconds']:.1f} s", file=sys.stderr)
    job.hvd.barrier()


if __name__ == "__main__":
    main()

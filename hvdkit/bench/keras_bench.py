"""Benchmark worker: Keras 3 training-step throughput on 1 and N ranks with hvdkit's optimizer.

    hvdkit run -np 2 -- python -m hvdkit.bench.keras_bench OUT.json [--quick]

Variants, interleaved: ``single`` (rank 0 alone, plain optimizer), ``compute_only`` (every rank,
nothing averaged) and ``hvdkit`` (``hvdkit.keras.DistributedOptimizer``), each a compiled
``train_on_batch`` on the same synthetic MLP as the PyTorch benchmark. Horovod's own Keras
optimizer is left out: under Keras 3 it does not average at all (see the contract tests). Before
timing, hvdkit's step must equal one process training on both ranks' batches together.
"""

import argparse
import json
import sys
import time

import numpy as np

from .stats import Samples, check_close, interleaved, timed
from .train_bench import BATCH, DEPTH, QUICK, WIDTH


def build_model(keras, width, depth, optimizer, seed=0):
    keras.utils.set_random_seed(seed)
    inputs = keras.Input((width,))
    h = inputs
    for _ in range(depth):
        h = keras.layers.Dense(width, activation="relu")(h)
    model = keras.Model(inputs, keras.layers.Dense(10)(h))
    model.compile(optimizer=optimizer, loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


class KerasJob:
    def __init__(self, width, depth, batch):
        import horovod.tensorflow as hvd
        import keras

        import hvdkit.keras as hk

        self.keras, self.hvd, self.hk = keras, hvd, hk
        hk.init(threads=1)
        self.rank, self.size = hk.rank(), hk.size()
        self.width, self.depth, self.batch = width, depth, batch
        rng = np.random.default_rng(1000 + self.rank)
        self.x = rng.standard_normal((batch, width)).astype(np.float32)
        self.y = rng.integers(0, 10, batch).astype(np.int32)

    def model(self, distributed):
        opt = self.keras.optimizers.SGD(0.01)
        return build_model(
            self.keras, self.width, self.depth, self.hk.DistributedOptimizer(opt) if distributed else opt
        )

    def wait(self, name):
        """Every rank blocks here until rank 0 arrives (a broadcast: no busy loop in Python)."""
        return self.hvd.broadcast_object(None, root_rank=0, name=name)

    def check(self):
        """hvdkit on N ranks == one process on the N batches together, and identical across ranks."""
        dist = self.model(True)
        dist.train_on_batch(self.x, self.y)
        xs = self.hvd.allgather_object(self.x, name="bench.keras.x")
        ys = self.hvd.allgather_object(self.y, name="bench.keras.y")
        ref = self.model(False)
        ref.train_on_batch(np.concatenate(xs), np.concatenate(ys))
        got = np.concatenate([w.reshape(-1) for w in dist.get_weights()])
        want = np.concatenate([w.reshape(-1) for w in ref.get_weights()])
        first = self.hvd.allgather_object(got[:1000].tolist(), name="bench.keras.ranks")
        return {
            "hvdkit_vs_one_process_double_batch": check_close("keras hvdkit vs one process", got, want, 1e-5),
            "hvdkit_across_ranks": check_close("keras hvdkit across ranks", first[0], first[-1], 0.0),
        }

    def time_models(self, models, reps, steps, tag, progress_after):
        """``{variant: Samples}``: seconds per ``steps`` training steps of each model, ``reps`` times
        interleaved. ``"single"`` trains on rank 0 alone (its time broadcast); the others on every
        rank, aligned first. Rank 0 shows progress after each ``progress_after`` rep.
        Collective: every rank calls it with the same variants."""
        steps_fn = {v: (lambda m=m: m.train_on_batch(self.x, self.y)) for v, m in models.items()}
        for v in models:
            if v != "single":
                steps_fn[v]()  # trace and build before timing
        if self.rank == 0:
            steps_fn["single"]()
        samples = {v: Samples() for v in models}
        for rep, v in interleaved(list(models), reps):
            if v == "single":
                seconds = timed(steps_fn[v], steps) if self.rank == 0 else None
                samples[v].add(self.hvd.broadcast_object(seconds, root_rank=0, name=f"bench.{tag}.single"))
                continue
            self.wait(f"bench.{tag}.align")
            steps_fn[v]()
            samples[v].add(timed(steps_fn[v], steps))
            if v == progress_after and self.rank == 0:
                print(f"[bench {tag}] rep {rep + 1}/{reps} done", file=sys.stderr, flush=True)
        return samples

    def run(self, reps, steps):
        checks = self.check()
        models = {"single": self.model(False), "compute_only": self.model(False), "hvdkit": self.model(True)}
        samples = self.time_models(models, reps, steps, "keras", "hvdkit")
        single = samples["single"].median
        return {
            "model": {"width": self.width, "depth": self.depth, "batch_per_rank": self.batch},
            "checks": checks,
            "variants": {
                v: {
                    **s.as_dict(),
                    "samples_per_s": (1 if v == "single" else self.size) * self.batch / s.median,
                    "scaling_efficiency": single / s.median,
                }
                for v, s in samples.items()
            },
        }


def job_main(job_class, description, argv=None):
    """The command line of a 2-rank Keras benchmark job: ``OUT [--quick] [--reps K] [--steps N]``;
    rank 0 writes ``job_class(width, depth, batch).run(reps, steps)`` with its wall time to OUT."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument("out")
    p.add_argument("--quick", action="store_true", help="tiny model, 1 repetition: checks, not figures")
    p.add_argument("--reps", type=int, default=11)
    p.add_argument("--steps", type=int, default=4)
    args = p.parse_args(argv)
    width, depth, batch = QUICK if args.quick else (WIDTH, DEPTH, BATCH)
    job = job_class(width, depth, batch)
    t0 = time.perf_counter()
    result = job.run(1 if args.quick else args.reps, 2 if args.quick else args.steps)
    result["seconds"] = time.perf_counter() - t0
    if job.rank == 0:
        with open(args.out, "w", encoding="utf-8") as f:
            json.dump(result, f, indent=1)


def main(argv=None):
    job_main(KerasJob, __doc__.splitlines()[0], argv)


if __name__ == "__main__":
    main()

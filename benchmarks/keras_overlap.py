"""Lab worker: can the Keras adapter overlap its allreduce with the backward pass? Grouped vs bucketed.

    hvdkit run -np 2 -- python -m benchmarks.keras_overlap OUT.json [--quick] [--reps 11]

(from the repository root: ``benchmarks`` is not installed)

Keras 3 calls ``optimizer.apply(grads)`` after ``tape.gradient`` has returned every gradient, so in
eager mode nothing can start earlier. Inside the ``tf.function`` that ``fit`` traces, though, TF runs
ops as soon as their inputs exist and Horovod's allreduce op is asynchronous: an allreduce whose
gradients are ready can run on Horovod's thread while backward computes the rest. One grouped
allreduce (hvdkit's default) waits for every gradient; ``groups=k`` splits them into k grouped
allreduces (last layers first) and ``groups=0`` sends one per gradient. Variants, interleaved:
``single`` (rank 0 alone), ``compute_only`` (every rank, nothing averaged) and the distributed
optimizer at ``groups`` 1, 4 and 0. Besides each variant's median, the ratio to ``grouped_1`` is taken
within every repetition (the two ran seconds apart) and its median and quartiles reported: on a
busy shared machine that paired ratio is far steadier than a ratio of medians. Before timing, each
distributed variant must leave weights bitwise identical across ranks and equal to one process on
the ranks' batches together.
"""

import statistics

import numpy as np

from hvdkit.bench.keras_bench import KerasJob, build_model, job_main
from hvdkit.bench.stats import check_close

GROUPS = {"grouped_1": 1, "groups_4": 4, "per_tensor": 0}


class OverlapJob(KerasJob):
    def model(self, groups=None):
        opt = self.keras.optimizers.SGD(0.01)
        if groups is not None:
            opt = self.hk.DistributedOptimizer(opt)
            opt._hvdkit_groups = groups  # hvdkit's own knob (see hvdkit.tensorflow.gradients.allreduce_gradients)
        return build_model(self.keras, self.width, self.depth, opt)

    def check_variant(self, label, groups, tol):
        """Weights after 2 steps: identical across ranks, equal to one process on both batches."""
        dist = self.model(groups)
        for _ in range(2):
            dist.train_on_batch(self.x, self.y)
        xs = self.hvd.allgather_object(self.x, name=f"bench.overlap.x.{label}")
        ys = self.hvd.allgather_object(self.y, name=f"bench.overlap.y.{label}")
        ref = self.model(None)
        for _ in range(2):
            ref.train_on_batch(np.concatenate(xs), np.concatenate(ys))
        got = np.concatenate([w.reshape(-1) for w in dist.get_weights()])
        want = np.concatenate([w.reshape(-1) for w in ref.get_weights()])
        first = self.hvd.allgather_object(got.tobytes(), name=f"bench.overlap.ranks.{label}")
        return {
            "vs_one_process": check_close(f"keras {label} vs one process", got, want, tol),
            "bitwise_identical_across_ranks": all(b == first[0] for b in first),
        }

    def run(self, reps, steps, tol=1e-5):
        checks = {label: self.check_variant(label, g, tol) for label, g in GROUPS.items()}
        for label, c in checks.items():
            if not c["bitwise_identical_across_ranks"]:
                raise AssertionError(f"keras {label}: ranks ended with different weights")
        models = {"single": self.model(None), "compute_only": self.model(None)}
        models.update({label: self.model(g) for label, g in GROUPS.items()})
        samples = self.time_models(models, reps, steps, "keras-overlap", "per_tensor")
        single, grouped = samples["single"].median, samples["grouped_1"].median
        base = samples["grouped_1"].values
        paired = {v: _quartiles([g / t for g, t in zip(base, samples[v].values, strict=True)]) for v in GROUPS}
        return {
            "paired_speedup_vs_grouped_1": paired,
            "model": {"width": self.width, "depth": self.depth, "batch_per_rank": self.batch},
            "checks": checks,
            "variants": {
                v: {**s.as_dict(), "scaling_efficiency": single / s.median, "speedup_vs_grouped_1": grouped / s.median}
                for v, s in samples.items()
            },
        }


def _quartiles(values):
    """``{"median", "q1", "q3", "n"}`` of ``values``."""
    xs = sorted(values)
    at = lambda q: xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]  # noqa: E731 - nearest rank
    return {"median": statistics.median(xs), "q1": at(0.25), "q3": at(0.75), "n": len(xs)}


def main(argv=None):
    job_main(OverlapJob, __doc__.splitlines()[0], argv)


if __name__ == "__main__":
    main()

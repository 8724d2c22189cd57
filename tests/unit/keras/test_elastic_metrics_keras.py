"""The metric state ``hk.elastic.fit`` commits and restores (``hvdkit.keras.elastic.metrics``), so that an epoch cut
by a recovery or a stop logs the metrics of the whole epoch. Ranks are played in one process by one compiled model
whose weights do not change (Keras's ``test_step`` updates the compiled loss tracker and ``accuracy`` as a train
step does, without training), so the uninterrupted run has known per-rank states to compare with. The jobs:
tests/e2e/test_in_process_recovery_keras.py.
"""

import numpy as np
import pytest

keras = pytest.importorskip("keras")
tf = pytest.importorskip("tensorflow")

import hvdkit.keras  # noqa: E402,F401  (hvdkit's Keras settings, as in the other Keras unit tests)
from hvdkit.core import LocalCommunicator  # noqa: E402
from hvdkit.core.errors import ConfigError  # noqa: E402
from hvdkit.keras.elastic import metrics  # noqa: E402


def test_share_is_each_ranks_own_state_at_the_committed_size_and_keeps_the_job_wide_sum_at_another():
    committed = {"layout": ["t[]", "c[]"], "ranks": [[1.5, 2.0], [0.25, 3.0], [4.0, 1.0]]}
    assert [metrics.share(committed, 3, r) for r in range(3)] == committed["ranks"]  # the same numbers
    assert metrics.share(committed, 1, 0) == [5.75, 6.0]
    two = [metrics.share(committed, 2, r) for r in range(2)]
    assert two == [[5.5, 3.0], [0.25, 3.0]] and list(map(sum, zip(*two, strict=True))) == [5.75, 6.0]
    one = {"layout": ["t[]"], "ranks": [[7.0]]}
    assert [metrics.share(one, 2, r) for r in range(2)] == [[7.0], [0.0]]  # 1 rank to 2: rank 1 adds nothing


def test_a_committed_state_that_is_not_fits_is_refused_naming_where_it_came_from():
    good = {"layout": ["t[]"], "ranks": [[1, 2.5]]}
    assert metrics.check(good, "checkpoint x") == {"layout": ["t[]"], "ranks": [[1.0, 2.5]]}
    assert metrics.check(None, "checkpoint x") is None
    for bad in ({"layout": ["t[]"]}, {"layout": ["t[]"], "ranks": [[1.0], [1.0, 2.0]]}, [1.0], {"ranks": [["a"]]}):
        with pytest.raises(ConfigError, match="checkpoint ckpt/step-7 holds metrics that are not"):
            metrics.check(bad, "checkpoint ckpt/step-7")


def model():
    keras.utils.set_random_seed(3)
    m = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3)])
    m.compile(optimizer="sgd", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
    return m


def shards(size, batches=6, batch=7):
    """Rank r's batches of an epoch (the same samples at every size: 2 ranks' batches are 1 rank's, split)."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(2 * batches * batch, 4)).astype(np.float32)
    y = rng.integers(0, 3, size=2 * batches * batch)
    parts = [(x[i : i + batch], y[i : i + batch]) for i in range(0, len(x), batch)]
    return [parts[r::size] for r in range(size)]


def run(m, batches, committed=None, size=1, rank=0):
    """An epoch's batches from Keras's reset, the committed state added after the first; the local state."""
    m.reset_metrics()
    for i, (x, y) in enumerate(batches):
        m.test_step((tf.constant(x), tf.constant(y)))
        if i == 0 and committed is not None:
            assert metrics.restore(m, committed, size, rank)
    return metrics.local_state(m)


def job_wide(m, states):
    """What MetricAverageCallback logs from these per-rank states: the summed state's results."""
    summed = np.sum(np.asarray(states, np.float64), axis=0)
    i = 0
    for v in [v for metric in m.metrics for v in metric.variables]:
        n = int(np.prod(v.shape))
        v.assign(np.reshape(summed[i : i + n], tuple(v.shape)).astype(v.dtype))
        i += n
    return {k: float(v) for k, v in m.get_metrics_result().items()}


def test_an_epoch_resumed_at_the_same_size_ends_with_each_ranks_metric_state_bitwise_as_without_the_cut():
    m, ranks = model(), shards(2)
    whole = [run(m, ranks[r]) for r in range(2)]
    committed = {"layout": metrics.layout(m), "ranks": [run(m, ranks[r][:2]) for r in range(2)]}
    resumed = [run(m, ranks[r][2:], committed, 2, r) for r in range(2)]
    assert resumed == whole  # loss tracker (total, count) and accuracy (total, count) of each rank
    assert metrics.layout(m) == ["loss/total[]", "loss/count[]", "accuracy/total[]", "accuracy/count[]"]
    without = job_wide(m, [run(m, ranks[r][2:]) for r in range(2)])  # the batches after the cut only
    assert without["loss"] != job_wide(m, whole)["loss"]


@pytest.mark.parametrize(("before", "after"), [(2, 1), (1, 2)])
def test_an_epoch_cut_at_one_size_and_ended_at_another_logs_the_whole_epochs_metrics(before, after):
    """2 ranks to 1 (a lost worker) and back (a join): the job-wide loss within float32 rounding (the committed
    states are added into other accumulators), the accuracy exactly (counts)."""
    m = model()
    first, second = shards(before), shards(after)
    whole = job_wide(m, [run(m, shard) for shard in first])
    k = 2  # batches of the epoch each rank of ``before`` did before the cut: the first 2 * before of the epoch
    committed = {"layout": metrics.layout(m), "ranks": [run(m, shard[:k]) for shard in first]}
    done = k * before
    rest = [run(m, shard[done // after :], committed, after, r) for r, shard in enumerate(second)]
    got = job_wide(m, rest)
    assert got["accuracy"] == whole["accuracy"] and got["loss"] == pytest.approx(whole["loss"], rel=1e-6, abs=0)
    assert sum(s[1] for s in rest) == 2 * 6 * 7  # every sample of the epoch counted once in the loss tracker


def test_a_gather_on_one_rank_is_its_state_and_a_state_of_other_metrics_is_not_added():
    m, (batches,) = model(), shards(1)
    run(m, batches[:1])
    got = metrics.gather(m, LocalCommunicator())
    assert got == {"layout": metrics.layout(m), "ranks": [metrics.local_state(m)]} and got["ranks"][0][1] == 7
    other = {"layout": ["loss/total[]", "loss/count[]"], "ranks": [[1.0, 1.0]]}
    assert metrics.restore(m, other, 1, 0) is False and metrics.local_state(m) == got["ranks"][0]
    assert metrics.restore(m, None, 1, 0) is False

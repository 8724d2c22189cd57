import math

import pytest

from hvdkit.core import ConfigError, LocalCommunicator, MetricTracker, average_metrics


def test_weighted_mean_equals_mean_over_all_samples_of_uneven_batches():
    values = [float(i * i) for i in range(10)]
    t = MetricTracker(["loss"])
    t.update("loss", sum(values[:7]) / 7, count=7)  # a batch of 7 samples, given as its mean
    t.update("loss", sum(values[7:]) / 3, count=3)
    got = t.compute(LocalCommunicator())["loss"]
    assert got == pytest.approx(sum(values) / 10, rel=1e-12)
    # the unweighted mean of batch means (Horovod's MetricAverageCallback) would be far off
    assert abs(got - (sum(values[:7]) / 7 + sum(values[7:]) / 3) / 2) > 10


def test_metric_with_no_samples_is_nan_not_a_division_error():
    out = average_metrics({"acc": (0.0, 0)}, LocalCommunicator())
    assert math.isnan(out["acc"])


def test_negative_count_is_rejected_with_the_value():
    with pytest.raises(ConfigError, match=r"got -1"):
        MetricTracker().update("loss", 1.0, count=-1)


def test_reset_clears_sums_and_counts():
    t = MetricTracker()
    t.update_sum("acc", 3, 4)
    t.reset()
    assert t.local() == {"acc": (0.0, 0)}

"""``hk.DistributedOptimizer(..., bucket_mb=)`` on 2 real ranks: DDP-style buckets change no bit.

The worker trains the same MLP with 4 KiB buckets (three grouped allreduces per step, each started
from the hook of its last gradient) and without buckets: SGD, Adam accumulating 2 backward passes,
fp16 compression, and a layer no rank uses. Averaging a bucket sums the same elements over the same
two ranks as averaging each gradient alone, so the parameters must match bitwise, and match across
ranks.
"""

import pool
import pytest

pytestmark = pytest.mark.dist
CASES = ("sgd", "adam_accumulate", "fp16", "unused")


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    out = tmp_path_factory.mktemp("buckets")
    results = pool.run_worker("horovodrun-gloo", "torch", "buckets_torch", out, timeout=400)
    for r in results:
        assert "failure" not in r, r["failure"]
    return results


@pytest.mark.parametrize("case", CASES)
def test_bucketed_averaging_is_bitwise_the_unbucketed_one_on_every_rank(ranks, case):
    for r in ranks:
        assert r[case]["on"]["digest"] == r[case]["off"]["digest"]
    assert ranks[0][case]["on"]["digest"] == ranks[1][case]["on"]["digest"]


def test_the_buckets_follow_backward_order_and_close_at_their_size(ranks):
    # Reversed: 5 + 120 + 24 + 1152 elements close the first 4 KiB bucket, 48 + 1536 the second,
    # the first layer's 32 + 384 are the rest; the unused 7x7 layer (56 elements) joins the last.
    for r in ranks:
        assert r["sgd"]["on"]["bucket_sizes"] == [5204, 6336, 1664]
        assert r["unused"]["on"]["bucket_sizes"] == [5204, 6336, 1888]
        assert r["sgd"]["off"]["bucket_sizes"] is None


def test_buckets_with_zero1_or_a_negative_size_are_config_errors(ranks):
    refusals = ranks[0]["refusals"]
    assert "bucket_mb" in refusals["sharded"] and "shard_optimizer_state" in refusals["sharded"]
    assert "bucket_mb must be a number of MiB > 0" in refusals["negative"] and "-1" in refusals["negative"]

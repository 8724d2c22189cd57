"""ZeRO-1's reduce-scatter overlapped with backward (``hvdkit.torch.zero_overlap``), on 2 real ranks.

Under mpirun and horovodrun --gloo: with 13 rounds of 256 elements, rounds start while backward
runs (counted by a probe at the network's input, which backward reaches last), and the overlap
changes no bit of the result (against the same sharded run with ``overlap = False``), with
accumulation and fp16 on the wire, and with an unused layer whose round waits for ``step()``. One
backward pass too many is a ConfigError on every rank naming the fix, and the job goes on after
``zero_grad()``. Rounds whose gradients complete in a different order on each rank (two branches run
in reversed order, or one branch unused on rank 1) must not deadlock: every rank starts rounds in
one order (the last round first), so none waits in a hook for a round another rank has not started.
Worker: workers/zero_overlap_torch.py.
"""

import pool
import pytest
from helpers import LAUNCHERS

pytestmark = pytest.mark.dist
CASES = ("sgd", "adam_accumulate_fp16", "unused", "asymmetric", "branches")


@pytest.fixture(scope="module", params=LAUNCHERS)
def ranks(request, tmp_path_factory):
    out = tmp_path_factory.mktemp(f"zero-overlap-{request.param}")
    results = pool.run_worker(
        request.param, "torch", "zero_overlap_torch", out, timeout=240
    )  # a deadlock fails, not hangs
    for r, res in enumerate(results):
        assert "failure" not in res, f"rank {r}: {res['failure']}"
    return results


@pytest.mark.parametrize("case", CASES)
def test_the_overlap_changes_no_bit_and_ranks_agree(ranks, case):
    digests = {(r, mode): res[case][mode]["digest"] for r, res in enumerate(ranks) for mode in ("on", "off")}
    assert len(set(digests.values())) == 1, digests


@pytest.mark.parametrize("case", ["sgd", "adam_accumulate_fp16"])
def test_rounds_start_during_backward_when_every_gradient_arrives(ranks, case):
    for res in ranks:
        on, off = res[case]["on"], res[case]["off"]
        assert on["rounds"]["rounds"] == 13 and on["rounds"]["largest_round"] <= 256
        assert on["rounds"]["overlapped"] == 13  # every round started in backward
        # between layers 1 and 0 (layer 0's backward still to run) the rounds of layers 3-1 had started,
        # not those that need layer 0's gradients; with 2 accumulated passes only in the second pass
        seen = on["started_at_input"]
        last_pass = seen[1::2] if case == "adam_accumulate_fp16" else seen
        assert last_pass and all(0 < n < 13 for n in last_pass), seen
        if case == "adam_accumulate_fp16":
            assert set(seen[0::2]) == {0}, seen
        assert off["rounds"]["overlapped"] == 0 and set(off["started_at_input"]) == {0}


def test_rounds_holding_a_parameter_without_gradient_wait_for_step(ranks):
    for res in ranks:
        rounds = res["unused"]["on"]["rounds"]
        assert rounds["rounds"] == 13 + 1  # the unused layer's 30 elements make one more round
        # its round (0, the last in round_order) waits for step(); every round before it started in backward
        assert rounds["overlapped"] == rounds["rounds"] - 1


def test_one_backward_too_many_is_an_error_on_every_rank_and_zero_grad_recovers(ranks):
    for res in ranks:
        on, off = res["too_many"]["on"], res["too_many"]["off"]
        assert "backward() ran 3 times" in on["error"] and "backward_passes_per_step=3" in on["error"]
        assert off["error"] is None
        assert on["digest"] == off["digest"]
    assert ranks[0]["too_many"]["on"]["digest"] == ranks[1]["too_many"]["on"]["digest"]


def test_rounds_completed_in_another_order_on_each_rank_start_in_one_order_without_deadlock(ranks):
    for case in ("asymmetric", "branches"):
        for res in ranks:
            assert res[case]["on"]["rounds"]["rounds"] == 17
            assert res[case]["off"]["rounds"]["overlapped"] == 0
    # reversed branches: every round still starts during backward, on both ranks
    assert [res["branches"]["on"]["rounds"]["overlapped"] for res in ranks] == [17, 17]
    # branch B unused on rank 1: the rounds come last-first, so rank 1, whose first (16) never completes,
    # leaves them all to step(); rank 0 starts them all in backward
    assert [res["asymmetric"]["on"]["rounds"]["overlapped"] for res in ranks] == [17, 0]

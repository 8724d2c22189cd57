"""ZeRO-1 (``shard_optimizer_state=True``) for torch on 2 real ranks, under mpirun and horovodrun --gloo.

The sharded optimizer must train exactly what the unsharded one trains (to fp32 rounding), keep
the ranks bitwise identical, hold about half the optimizer state on each rank, write checkpoints a
1-rank unsharded job resumes from (gathering the state to rank 0 in bounded rounds), skip an fp16
inf/NaN step on every rank together under hk.amp_step, and refuse LBFGS on every rank without hanging.
Worker: workers/zero_torch.py (model: three param groups of 43 trainable elements and a frozen parameter,
15, and 1: rank 1 owns none of the last).
"""

import pool
import pytest
import torch
from helpers import LAUNCHERS, ROOT

pytestmark = pytest.mark.dist
WORKER = ROOT / "tests" / "distributed" / "workers" / "zero_torch.py"
KINDS = ("sgd", "adam", "adamw", "adam_accumulate_clip")
OTHERS = ("Adamax", "NAdam", "RAdam", "RMSprop", "Adagrad", "Adadelta", "ASGD")  # the rest of the allow-list
TOL = 1e-6  # relative, fp32 rounding
PLAIN_TOL = 1e-5  # relative, against plain torch on the whole batch (a mean of two halves rounds apart)


def _results(launcher, np_, out, mode):
    return pool.mode_results(launcher, "torch", WORKER, np_, out, mode, timeout=400)


@pytest.fixture(scope="module", params=LAUNCHERS)
def runs(request, tmp_path_factory):
    out = tmp_path_factory.mktemp(f"zero-{request.param}")
    trained = _results(request.param, 2, out, "train")
    resumed = _results(request.param, 1, out, "resume")
    regrown = _results(request.param, 2, out, "regrow")
    return trained, resumed[0], regrown


@pytest.mark.parametrize("kind", KINDS)
def test_sharded_parameters_are_bitwise_equal_on_every_rank(runs, kind):
    r0, r1 = runs[0]
    assert r0[kind]["digest"] == r1[kind]["digest"]


@pytest.mark.parametrize("kind", KINDS)
def test_sharded_training_equals_the_unsharded_optimizer_to_fp32_rounding(runs, kind):
    for r in runs[0]:
        assert r[kind]["rel_diff"] < TOL
        assert r[kind]["moved"] > 1e-2  # the parameters really trained


def test_clipping_uses_the_same_global_norm_as_the_unsharded_optimizer(runs):
    for r in runs[0]:
        result = r["adam_accumulate_clip"]
        assert len(result["norms"]) == 24
        assert min(result["plain_norms"]) > 0.05  # every step was clipped
        assert result["norms"] == pytest.approx(result["plain_norms"], rel=1e-5)


@pytest.mark.parametrize("kind", KINDS)
def test_each_rank_holds_about_half_the_optimizer_state(runs, kind):
    ranks = [r[kind] for r in runs[0]]
    plain, plain_all = ranks[0]["plain_state_per_element"], ranks[0]["plain_state_elements"]
    assert plain > 50
    # the per-element state (momentum, moments): every element once over the ranks, half (+ at most one
    # element per group and key, 3 groups, 2 keys) on each
    assert sum(r["state_per_element"] for r in ranks) == plain
    for r in ranks:
        assert r["plain_state_per_element"] == plain
        assert r["state_per_element"] <= plain / 2 + 6
        assert r["state_elements"] <= 0.55 * plain_all  # step counts included: one per group instead of per tensor


@pytest.mark.parametrize("kind", KINDS)
def test_the_sharded_state_dict_is_the_unsharded_optimizers(runs, kind):
    for r in runs[0]:
        assert r[kind]["state_dict_same_structure"]
        assert r[kind]["state_dict_max_diff"] < 1e-6


@pytest.mark.parametrize("kind", OTHERS)
def test_every_other_allowed_optimizer_trains_sharded_as_unsharded_with_about_half_the_state(runs, kind):
    r0, r1 = (r[kind] for r in runs[0])
    assert r0["digest"] == r1["digest"]
    for r in (r0, r1):
        assert r["rel_diff"] < TOL
        assert r["moved"] > 1e-4
        assert r["state_dict_same_structure"]  # Adagrad's state for the frozen parameter included
        assert r["state_dict_max_diff"] < 1e-6
        assert r["state_elements"] <= 0.56 * r["plain_state_elements"]  # scalars per group, not per tensor


def test_a_non_elementwise_optimizer_is_refused_on_every_rank_with_the_fix(runs):
    for r in runs[0]:
        message = r["refused"]
        assert message is not None
        assert "LBFGS" in message and "shard_optimizer_state=False" in message


def test_a_checkpoint_saved_sharded_at_2_ranks_resumes_unsharded_at_1_rank_and_continues_equal(runs):
    (r0, r1), resumed, _ = runs
    assert r0["checkpoint"]["digest"] == r1["checkpoint"]["digest"]
    assert (resumed["step"], resumed["saved_size"]) == (12, 2)
    uninterrupted = torch.tensor(r0["checkpoint"]["final"], dtype=torch.float64)
    final = torch.tensor(resumed["final"], dtype=torch.float64)
    assert float(((final - uninterrupted).abs() / uninterrupted.abs().clamp(min=1e-3)).max()) < TOL


def test_fp16_compression_on_the_wire_matches_the_unsharded_fp16_average(runs):
    for r in runs[0]:
        assert r["adam_fp16"]["compression"] == "fp16"
        assert r["adam_fp16"]["rel_diff"] < 1e-4
    assert runs[0][0]["adam_fp16"]["digest"] == runs[0][1]["adam_fp16"]["digest"]
    assert runs[0][0]["adam_fp16"]["digest"] != runs[0][0]["adam"]["digest"]  # fp16 really was used


@pytest.mark.parametrize("kind", ["amp", "amp_clip"])
def test_amp_step_sharded_trains_as_unsharded_and_every_rank_skips_an_inf_step_together(runs, kind):
    r0, r1 = (r[kind] for r in runs[0])
    assert r0["digest"] == r1["digest"]
    inf_at = 5  # rank 1 alone put an inf into a gradient element that rank 0's slice holds
    for r in (r0, r1):
        assert r["rel_diff"] < TOL
        assert r["moved"] > 1e-2
        assert r["skipped"] == r["plain_skipped"] == [s == inf_at for s in range(12)]
        assert r["scales"] == r["plain_scales"]
        assert r["scales"][inf_at] == r["scales"][inf_at - 1] / 2  # the scale backed off on every rank
        assert max(r["scales"]) > 1024.0  # and grew where no inf was found
        assert r["state_per_element"] <= r["plain_state_per_element"] / 2 + 6


def test_state_dict_after_a_step_without_consolidating_says_what_to_call(runs):
    for r in runs[0]:
        assert "consolidate_state_dict() on every rank" in r["state_errors"]["unconsolidated"]


def test_state_dict_on_a_rank_the_state_was_not_consolidated_to_names_the_rank(runs):
    assert runs[0][0]["state_errors"]["elsewhere"] is None
    message = runs[0][1]["state_errors"]["elsewhere"]
    assert "consolidated to rank 0" in message and "consolidate_state_dict(to=None)" in message


def test_consolidating_to_rank_0_moves_bounded_rounds_and_other_ranks_keep_nothing(runs):
    r0, r1 = (r["bounded"] for r in runs[0])
    whole = r0["state_per_element"]  # Adam's two moments over 68,362 parameters
    assert whole == 2 * 68362
    chunk = r0["chunk"]
    for r in (r0, r1):
        assert r["to_rank0"]["to"] == 0
        assert r["to_rank0"]["rounds"] >= whole // chunk  # in rounds, not all at once
        assert 0 < r["to_rank0"]["largest_round"] <= chunk  # the most any rank received at once
        assert r["to_rank0"]["spied_largest"] == r["to_rank0"]["largest_round"]  # as Horovod handed it over
        assert r["to_rank0"]["spied_calls"] == r["to_rank0"]["rounds"]
    assert r0["to_rank0"]["kept"] == whole  # rank 0 holds the whole state
    assert r1["to_rank0"]["kept"] == 0  # rank 1: one round at a time, dropped at once (1/136 of the state)
    assert r0["same_as_everywhere"]  # bitwise the state dict consolidate_state_dict(to=None) gives
    for r in (r0, r1):
        assert r["everywhere"]["kept"] == whole


def test_a_restore_scatters_each_rank_only_its_slice_in_bounded_rounds(runs):
    r0, r1 = (r["bounded"] for r in runs[0])
    whole, chunk = r0["state_per_element"], r0["chunk"]
    for r in (r0, r1):
        s = r["scatter"]
        assert s["slices_equal"]  # bitwise the slices this rank's optimizer held before the save
        assert s["params_equal"] and s["lr"] == 1e-3  # rank 0's parameters and hyperparameters
        assert s["own_per_element"] == whole // 2
        assert s["rounds"] == s["spied_calls"] >= (whole // 2) // chunk  # rank 1's half, in rounds
    assert r0["scatter"]["spied_received"] == 0  # the root sends, keeps the slices it loaded
    assert r1["scatter"]["spied_received"] == whole // 2  # rank 1 received exactly its slices, nothing more
    assert 0 < r1["scatter"]["spied_largest"] <= chunk  # never more than one round at a time


def test_checkpoint_save_gathers_to_rank_0_only_in_chunks(runs):
    c0, c1 = (r["checkpoint"]["consolidation"] for r in runs[0])
    assert c0["to"] == c1["to"] == 0
    assert c0["kept"] == 2 * 59  # AdamW's two moments over the 59 trainable elements
    assert c1["kept"] == 0
    assert c0["rounds"] == c1["rounds"] >= 2 * 59 // 5
    assert max(c0["largest_round"], c1["largest_round"]) <= 5


def test_a_state_dict_with_state_for_only_some_parameters_of_a_group_is_refused(runs):
    for r in runs[0]:
        assert "param group 0 has state for some of its trainable parameters only" in r["state_errors"]["partial"]


def test_a_sharded_run_restored_sharded_at_the_same_size_ends_bitwise_equal_to_the_uninterrupted_run(runs):
    for r in runs[0]:
        assert r["resumed_sharded"]["step"] == 12
        assert r["resumed_sharded"]["digest"] == r["checkpoint"]["digest"]


def test_a_1_rank_unsharded_checkpoint_resumes_sharded_at_2_ranks_and_continues_equal(runs):
    (r0, _), _, regrown = runs
    uninterrupted = torch.tensor(r0["checkpoint"]["final"], dtype=torch.float64)
    assert regrown[0]["digest"] == regrown[1]["digest"]
    for r in regrown:
        assert (r["step"], r["saved_size"]) == (18, 1)
        final = torch.tensor(r["final"], dtype=torch.float64)
        assert float(((final - uninterrupted).abs() / uninterrupted.abs().clamp(min=1e-3)).max()) < TOL


def test_the_synchronize_listener_hears_every_gradient_reduce_scatter(runs):
    for r in runs[0]:
        assert r["checkpoint"]["waits"] == 24  # one per step (hk.StragglerMonitor(optimizer=opt) listens)


def test_a_parameter_unfrozen_after_the_sharded_optimizer_was_built_is_an_error_naming_it_and_the_fix(runs):
    results = [r["recipes"]["unfrozen_sharded"] for r in runs[0]]
    for r in results:
        assert r["error"] is not None and r["error"].startswith("ConfigError: "), r["error"]
        assert "'backbone.weight'" in r["error"] and "rebuild the optimizer after unfreezing" in r["error"]
        assert "add_param_group" in r["error"]
        assert r["unfrozen_moved"] == 0.0  # the refused step changed nothing
        # rebuilt after unfreezing (the old one still alive), it trains as plain torch on the global batch
        assert r["moved"] > 1e-2
        assert r["rel_diff"] < PLAIN_TOL
    assert results[0]["digest"] == results[1]["digest"]


def test_a_parameter_unfrozen_after_the_unsharded_optimizer_was_built_is_averaged_as_plain_torch(runs):
    results = [r["recipes"]["unfrozen_unsharded"] for r in runs[0]]
    for r in results:
        assert r["error"] is None
        assert r["unfrozen_moved"] > 1e-3  # trained from the first step after unfreezing
        assert r["rel_diff"] < PLAIN_TOL
    assert results[0]["digest"] == results[1]["digest"]  # the ranks did not drift apart


def test_a_param_group_added_to_a_sharded_optimizer_trains_as_plain_torch(runs):
    results = [r["recipes"]["added_group"] for r in runs[0]]
    for r in results:
        assert r["error"] is None
        assert r["moved"] > 1e-3  # the added backbone trained
        assert r["rel_diff"] < PLAIN_TOL
        assert r["same_structure"] and r["state_max_diff"] < 1e-6  # its state dict is plain torch's
    assert results[0]["digest"] == results[1]["digest"]


@pytest.mark.parametrize("method", ["synchronize", "skip_synchronize"])
def test_horovods_clipping_recipe_on_a_sharded_optimizer_names_max_grad_norm(runs, method):
    for r in runs[0]:
        message = r["recipes"]["synchronize"][method]
        assert message is not None and message.startswith("ConfigError: "), message
        assert "max_grad_norm=" in message and "shard_optimizer_state=False" in message
    assert runs[0][0]["recipes"]["synchronize"]["digest"] == runs[0][1]["recipes"]["synchronize"]["digest"]

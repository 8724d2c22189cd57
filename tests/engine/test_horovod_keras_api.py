"""Horovod's own Keras API (horovod.tensorflow.keras and horovod.keras) on the installed engine, Keras 3.

A real 2-rank job runs tests/engine/scripts/hvd_keras_api.py, written as Horovod users write their
scripts; each test reads what the ranks recorded. Every training surface must leave the weights bitwise
identical across ranks and within 1e-6 of one process trained on the whole batches.
Fixes: hvdkit/engine/recipe/horovod-fixes/4*.patch.

Under mpirun every section runs; under horovodrun --gloo the sections whose collectives the controller
carries (``fit``: allreduce of the gradients and the broadcast callback; ``sparse``: allgather of
IndexedSlices; ``collectives``: the Keras-level ops). The rest (optimizer options, callbacks, partial
optimizer, custom loops, Keras 2 errors) is the adapter's logic over the same allreduce, checked once
(issue 38: a TensorFlow job's worth of the suite's time less).
"""

import pytest
from helpers import LAUNCHERS, PYTHON, ROOT, launcher_argv, run_bounded, run_contract_worker

pytestmark = pytest.mark.dist
SCRIPTS = ROOT / "tests" / "engine" / "scripts"
FP32_TOL = 1e-6
FP16_TOL = 2e-3  # fp16 rounding of the averaged gradients over a few SGD steps
FLAVOURS = ("tf_keras", "keras")  # import horovod.tensorflow.keras / import horovod.keras


CONTROLLER_SECTIONS = ("fit", "sparse", "collectives")  # what runs under horovodrun --gloo too


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    """Each launcher's job, run the first time a test asks for it: ``job(launcher)`` is its ranks' records."""
    done = {}

    def run(launcher):
        if launcher not in done:
            out = tmp_path_factory.mktemp(f"hvd-keras-{launcher}")
            only = () if launcher == "mpirun" else CONTROLLER_SECTIONS
            done[launcher] = run_contract_worker(launcher, SCRIPTS / "hvd_keras_api.py", out, timeout=540, args=only)
        return done[launcher]

    return run


@pytest.fixture
def ranks(job):
    """Every section, under mpirun."""
    return job("mpirun")


@pytest.fixture(params=LAUNCHERS)
def controller_ranks(request, job):
    """The sections whose collectives the controller carries, under each launcher."""
    return job(request.param)


def section(ranks, *path):
    """The value at ``path`` on each rank."""
    values = []
    for r in ranks:
        for key in path:
            r = r[key]
        values.append(r)
    return values


def assert_matches_one_process(ranks, *path, tol=FP32_TOL):
    d0, d1 = section(ranks, *path, "digest")
    assert d0 == d1, f"{path}: ranks differ"
    diffs = section(ranks, *path, "max_diff_vs_reference")
    assert max(diffs) <= tol, f"{path}: {diffs} from the one-process reference"


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_fit_with_distributed_optimizer_and_broadcast_callback_matches_one_process_with_double_batch(
    controller_ranks, flavour
):
    ranks = controller_ranks
    i0, i1 = section(ranks, flavour, "fit", "init_digest")
    assert i0 != i1  # the ranks started apart: BroadcastGlobalVariablesCallback(0) brought them together
    assert_matches_one_process(ranks, flavour, "fit", "instance")
    assert ranks[0][flavour]["fit"]["instance"]["moved"] > 1e-2  # the weights really trained


@pytest.mark.parametrize("made", ["from_name", "from_config", "name_string"])
def test_an_optimizer_made_from_a_name_or_config_averages_too(ranks, made):
    assert_matches_one_process(ranks, "tf_keras", "fit", made)


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_load_model_rewraps_the_optimizer_with_its_state_and_keeps_averaging(controller_ranks, flavour):
    ranks = controller_ranks
    assert_matches_one_process(ranks, flavour, "fit", "load_model")
    for r in ranks:
        loaded = r[flavour]["fit"]["load_model"]
        assert loaded["optimizer_class"] == "SGD" and loaded["iterations"] == 8  # 4 saved + 4 new steps


@pytest.mark.parametrize("loop", ["apply_gradients_eager", "apply_function"])
def test_custom_loops_calling_apply_gradients_or_apply_average_the_gradients(ranks, loop):
    assert_matches_one_process(ranks, "tf_keras", "custom_loop", loop)


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_backward_passes_per_step_with_averaging_matches_one_process_with_the_whole_batch(ranks, flavour):
    assert_matches_one_process(ranks, flavour, "options", "bpps_mean")
    assert all(r[flavour]["options"]["bpps_mean"]["iterations"] == 8 for r in ranks)


def test_backward_passes_per_step_without_averaging_sums_the_passes(ranks):
    assert_matches_one_process(ranks, "tf_keras", "options", "bpps_sum")


def test_gradient_predivide_factor_keeps_the_average(ranks):
    assert_matches_one_process(ranks, "tf_keras", "options", "predivide")


def test_fp16_compression_stays_within_a_tolerance_a_wrong_reduction_exceeds(ranks):
    assert_matches_one_process(ranks, "tf_keras", "options", "fp16", tol=FP16_TOL)
    assert ranks[0]["tf_keras"]["options"]["fp16"]["max_diff_vs_reference"] > 0  # the compression ran
    assert ranks[0]["tf_keras"]["options"]["wrong_local_only_diff"] > 10 * FP16_TOL


@pytest.mark.parametrize("variant", ["sparse", "sparse_as_dense"])
def test_embedding_gradients_average_as_indexed_slices_and_as_dense(controller_ranks, variant):
    ranks = controller_ranks
    assert ranks[0]["tf_keras"]["sparse"]["embedding_grad_type"] == "IndexedSlices"
    assert_matches_one_process(ranks, "tf_keras", "sparse", variant)


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_partial_distributed_optimizer_keeps_local_layers_local_and_averages_the_rest(ranks, flavour):
    s0, s1 = section(ranks, flavour, "partial", "shared_digest")
    h0, h1 = section(ranks, flavour, "partial", "head_digest")
    assert s0 == s1 and h0 != h1  # local heads were neither averaged nor broadcast
    for r in ranks:
        p = r[flavour]["partial"]
        assert p["shared_diff"] <= FP32_TOL and p["head_diff"] <= FP32_TOL


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_metric_average_callback_gives_every_rank_the_mean_of_the_ranks_logs(ranks, flavour):
    local = section(ranks, flavour, "callbacks", "metric_average", "local")
    averaged = section(ranks, flavour, "callbacks", "metric_average", "averaged")
    assert averaged[0] == averaged[1]
    assert local[0] != local[1]
    for epoch in range(3):
        mean = (local[0][epoch]["loss"] + local[1][epoch]["loss"]) / 2
        assert averaged[0][epoch]["loss"] == pytest.approx(mean, rel=1e-6)
    assert section(ranks, flavour, "callbacks", "metric_average", "history_loss")[0] == [a["loss"] for a in averaged[0]]


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_learning_rate_warmup_callback_follows_horovods_formula_and_training_matches(ranks, flavour):
    size, lr = 2, 0.1 * 2
    expect = [lr / size * ((e + (b + 1) / 4) * (size - 1) / 2 + 1) if e < 2 else lr for e in range(3) for b in range(4)]
    for r in ranks:
        assert r[flavour]["callbacks"]["warmup"]["lrs"] == pytest.approx(expect, rel=1e-6)
    assert_matches_one_process(ranks, flavour, "callbacks", "warmup")


def test_learning_rate_schedule_callback_sets_and_logs_the_rate_each_epoch(ranks):
    sched = ranks[0]["tf_keras"]["callbacks"]["schedule"]
    assert sched["lrs"] == pytest.approx([0.1 * 0.5**e for e in range(3) for _ in range(4)], rel=1e-6)
    assert sched["logged_lr"] == pytest.approx([0.1, 0.05, 0.025], rel=1e-6)
    assert_matches_one_process(ranks, "tf_keras", "callbacks", "schedule")


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_keras2_only_usage_is_a_clear_error_on_every_rank(ranks, flavour):
    for r in ranks:
        e = r[flavour]["keras2_apis"]
        assert e["lr_config"].startswith("ValueError") and "use `learning_rate`" in e["lr_config"]
        assert e["v1_optimizer"].startswith("TypeError") and "keras.optimizers.SGD(learning_rate=" in e["v1_optimizer"]
        assert "horovod.tensorflow.DistributedOptimizer" in e["v1_optimizer"]
        assert "legacy_opts=False" in e["legacy_opts"] and "keras.optimizers.legacy" in e["legacy_opts"]
        assert "wrap the plain optimizer once" in e["rewrap"]
        assert e["after"] == 1.5  # and the ranks still meet in the next collective


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_keras_level_allreduce_allgather_broadcast(controller_ranks, flavour):
    ranks = controller_ranks
    for r in ranks:
        assert r[flavour]["collectives"] == {"allreduce": 1.5, "allgather": [1, 2], "broadcast": 5.0}


@pytest.mark.parametrize("launcher", LAUNCHERS)
def test_an_uncaught_keras2_error_ends_the_job_on_every_rank_without_a_hang(launcher):
    argv = launcher_argv(launcher, 2) + [PYTHON, str(SCRIPTS / "hvd_keras_keras2_error.py")]
    proc = run_bounded(argv, timeout=240)
    text = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert "unreachable" not in text
    # Every rank raises it (recorded per rank above); the launcher may end the slower rank before it prints.
    assert "which Keras 3 removed: use `learning_rate` instead" in text, text[-4000:]

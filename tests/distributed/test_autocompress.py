"""compression="auto" on 2 real ranks: one choice everywhere, logged once on rank 0, overridable.

torch and Keras/TensorFlow (``fit`` and the tape inside a ``tf.function``) run in the pool's jobs
under mpirun. One controller suffices: the controller changes which compression the timing picks,
not the contract (one choice, logged once, applied on every rank), and the collectives that spread
the choice are the ones test_torch_contracts checks under mpirun and Gloo. What auto chose is read from rank 0's log line and checked against
the training itself: "none" must match one process on the global batch to 1e-6 and "fp16" must
not (fp16 rounding moves these weights by ~2e-5), so a choice that was logged but not applied, or
applied differently on one rank, fails.
"""

import re

import pool
import pytest

pytestmark = pytest.mark.dist
EXACT = 1e-6
CHOICE = re.compile(r"^compression='auto' -> '(none|fp16)'")


@pytest.fixture(scope="module", params=["mpirun"])
def torch_ranks(request, tmp_path_factory):
    out = tmp_path_factory.mktemp(f"autocompress-torch-{request.param}")
    return pool.run_worker(request.param, "torch", "autocompress_torch", out, timeout=400)


@pytest.fixture(scope="module")
def keras_ranks(tmp_path_factory):
    out = tmp_path_factory.mktemp("autocompress-keras")
    return pool.run_worker("mpirun", "keras", "autocompress_keras", out, timeout=500)


def choice_logged(run):
    """The choice in rank 0's one log line of this run."""
    assert len(run["logged_on_rank0"]) == 1, run["logged_on_rank0"]
    match = CHOICE.match(run["logged_on_rank0"][0])
    assert match, run["logged_on_rank0"][0]
    return match.group(1)


def check_applied(ranks, label, expected=None):
    r0, r1 = (r["runs"][label] for r in ranks)
    assert r0["digest"] == r1["digest"]  # both ranks trained alike: they applied the same choice
    choice = choice_logged(r0) if expected is None else expected
    if choice == "none":
        assert r0["max_diff_vs_reference"] < EXACT
    else:
        assert EXACT < r0["max_diff_vs_reference"] < 1e-3
    return choice


def test_torch_measurement_is_identical_on_every_rank_and_decides_by_the_margin(torch_ranks):
    m0, m1 = (r["measured"] for r in torch_ranks)
    assert m0 == m1
    assert m0["nbytes"] == 4 * (8 * 64 + 64 + 64 * 4 + 4) and m0["tensors"] == 4
    assert m0["choice"] == ("fp16" if m0["fp16_s"] < 0.9 * m0["fp32_s"] else "none")


def test_torch_auto_is_logged_once_on_rank0_and_applied_alike_on_both_ranks(torch_ranks):
    run = torch_ranks[0]["runs"]["auto"]
    assert "4 gradients" in run["logged_on_rank0"][0] and "ms in fp32" in run["logged_on_rank0"][0]
    assert torch_ranks[1]["runs"]["auto"]["logged_here"] == []  # only rank 0 logs
    check_applied(torch_ranks, "auto")


@pytest.mark.parametrize("label, expected", [("auto_env_fp16", "fp16"), ("auto_env_none", "none")])
def test_torch_variable_overrides_the_measurement(torch_ranks, label, expected):
    assert choice_logged(torch_ranks[0]["runs"][label]) == expected
    assert "(env HVDKIT_COMPRESSION)" in torch_ranks[0]["runs"][label]["logged_on_rank0"][0]
    check_applied(torch_ranks, label, expected)


def test_torch_variable_set_on_one_rank_only_follows_rank0_and_every_rank_measures(torch_ranks):
    run = torch_ranks[0]["runs"]["auto_env_fp16_on_rank1_only"]
    assert "ms in fp32" in run["logged_on_rank0"][0]  # measured, as rank 0 has no variable
    check_applied(torch_ranks, "auto_env_fp16_on_rank1_only")


def test_torch_explicit_argument_wins_over_the_variable_and_logs_nothing(torch_ranks):
    assert torch_ranks[0]["runs"]["explicit_none_env_fp16"]["logged_on_rank0"] == []
    check_applied(torch_ranks, "explicit_none_env_fp16", "none")
    check_applied(torch_ranks, "explicit_fp16", "fp16")


def test_torch_bad_values_name_the_value_and_the_choices(torch_ranks):
    for r in torch_ranks:
        assert "(got 'int8')" in r["errors"]["argument"] and "'none', 'fp16', 'auto'" in r["errors"]["argument"]
        assert "HVDKIT_COMPRESSION must be one of none, fp16, auto (got 'bf16')" in r["errors"]["variable"]


def test_keras_measurement_is_identical_on_every_rank(keras_ranks):
    m0, m1 = (r["measured"] for r in keras_ranks)
    assert m0 == m1 and m0["tensors"] == 4 and m0["nbytes"] == 4 * (8 * 64 + 64 + 64 * 4 + 4)
    assert m0["choice"] == ("fp16" if m0["fp16_s"] < 0.9 * m0["fp32_s"] else "none")


@pytest.mark.parametrize("label", ["fit_auto", "tape_auto"])
def test_keras_auto_is_logged_once_on_rank0_and_applied_alike_on_both_ranks(keras_ranks, label):
    assert keras_ranks[1]["runs"][label]["logged_here"] == []
    check_applied(keras_ranks, label)


@pytest.mark.parametrize("label, expected", [("fit_auto_env_fp16", "fp16"), ("fit_auto_env_none", "none")])
def test_keras_variable_overrides_the_measurement(keras_ranks, label, expected):
    assert choice_logged(keras_ranks[0]["runs"][label]) == expected
    check_applied(keras_ranks, label, expected)


@pytest.mark.parametrize(
    "label, expected",
    [
        ("fit_explicit_none_env_fp16", "none"),
        ("fit_explicit_fp16", "fp16"),
        ("tape_explicit_none", "none"),
        ("tape_explicit_fp16", "fp16"),
    ],
)
def test_keras_explicit_argument_wins_and_logs_nothing(keras_ranks, label, expected):
    assert keras_ranks[0]["runs"][label]["logged_on_rank0"] == []
    check_applied(keras_ranks, label, expected)


def test_keras_bad_values_name_the_value_and_the_choices(keras_ranks):
    for r in keras_ranks:
        errors = r["errors"]
        assert "(got 'int8')" in errors["optimizer"] and "'auto'" in errors["optimizer"]
        assert "(got 'bf16')" in errors["tape"]
        assert "HVDKIT_COMPRESSION must be one of none, fp16, auto (got 'half')" in errors["variable"]

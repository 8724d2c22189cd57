"""How a trial's attempt ended, as both backends decide it (``hvdkit.tune.outcome.trial_outcome``): each
case is what an attempt left (exit code, reported epochs, pruning, a signal to hvdkit tune, the end of
its log) and the state, value, cause and reason text it must get."""

import math

import pytest

from hvdkit.tune.outcome import (
    COMPLETE,
    DIVERGED,
    EXITED,
    FAIL,
    INTERRUPTED,
    NO_METRIC,
    PRUNED,
    last_value,
    trial_outcome,
)

TWO_EPOCHS = {0: {"val_loss": 0.9, "acc": 0.5}, 1: {"val_loss": 0.4, "acc": 0.7}}
NO_HINT = "call hvdkit.tune.report(epoch, val_loss=...) or use hvdkit's Trainer"

CASES = [
    # (name, code, epochs, keyword arguments, state, value, cause, why, counted and retried)
    ("exit 0 with the metric", 0, TWO_EPOCHS, {}, COMPLETE, 0.4, "", "", False),
    ("pruned: the stopped job exits 143", 143, TWO_EPOCHS, {"pruned_at": 1}, PRUNED, 0.4, "", "", False),
    ("pruned at once, before a report", 143, {}, {"pruned_at": 0}, PRUNED, None, "", "", False),
    (
        "nonzero exit with the metric",
        3,
        TWO_EPOCHS,
        {"output": "Traceback\nRuntimeError: injected failure"},
        FAIL,
        0.4,
        EXITED,
        "exit code 3; last output:\nTraceback\nRuntimeError: injected failure",
        True,
    ),
    (
        "nonzero exit, the log named",
        1,
        {},
        {"output": "boom", "log": "/o/trials/0002/attempt-0004.log"},
        FAIL,
        None,
        EXITED,
        "exit code 1; last output (/o/trials/0002/attempt-0004.log):\nboom",
        True,
    ),
    (
        "exit 0 without the metric",
        0,
        {0: {"loss": 1.0, "acc": 0.5}},
        {},
        FAIL,
        None,
        NO_METRIC,
        f"exited 0 without reporting 'val_loss' (reported: acc, loss); {NO_HINT}",
        True,
    ),
    (
        "exit 0 having reported nothing",
        0,
        {},
        {},
        FAIL,
        None,
        NO_METRIC,
        f"exited 0 without reporting 'val_loss' (reported: nothing); {NO_HINT}",
        True,
    ),
    (
        "exit 0 with NaN",
        0,
        {0: {"val_loss": math.nan}},
        {},
        FAIL,
        math.nan,
        DIVERGED,
        "val_loss was nan (diverged)",
        False,
    ),
    (
        "exit 0 with inf",
        0,
        {0: {"val_loss": math.inf}},
        {},
        FAIL,
        math.inf,
        DIVERGED,
        "val_loss was inf (diverged)",
        False,
    ),
    (
        "interrupted: the stopped job exits 143",
        143,
        TWO_EPOCHS,
        {"interrupted": "SIGINT"},
        FAIL,
        0.4,
        INTERRUPTED,
        "interrupted by SIGINT sent to hvdkit tune",
        False,
    ),
    (
        "interrupted, before a report, exit 0",
        0,
        {},
        {"interrupted": "SIGTERM"},
        FAIL,
        None,
        INTERRUPTED,
        "interrupted by SIGTERM sent to hvdkit tune",
        False,
    ),
    (
        "interrupted after the last epoch: it finished",
        0,
        TWO_EPOCHS,
        {"interrupted": "SIGINT"},
        COMPLETE,
        0.4,
        "",
        "",
        False,
    ),
    (
        "pruned, then interrupted: still pruned",
        143,
        TWO_EPOCHS,
        {"pruned_at": 1, "interrupted": "SIGINT"},
        PRUNED,
        0.4,
        "",
        "",
        False,
    ),
]


@pytest.mark.parametrize(
    ("code", "epochs", "kw", "state", "value", "cause", "why", "counted"),
    [c[1:] for c in CASES],
    ids=[c[0] for c in CASES],
)
def test_an_attempt_ends_in_the_state_and_with_the_reason_of_its_case(
    code, epochs, kw, state, value, cause, why, counted
):
    end = trial_outcome(code, epochs, "val_loss", **kw)
    assert (end.state, end.cause, end.why, end.failed_attempt) == (state, cause, why, counted)
    assert end.value == value or (value is not None and math.isnan(value) and math.isnan(end.value))


def test_the_value_is_the_metric_at_the_last_epoch_that_reported_it():
    epochs = {0: {"val_loss": 0.9}, 2: {"val_loss": 0.3}, 3: {"acc": 0.8}, 1: {"val_loss": 0.5}}
    assert last_value(epochs, "val_loss") == 0.3
    assert last_value(epochs, "acc") == 0.8
    assert last_value(epochs, "f1") is None

"""Learning-rate scaling and warmup: hvdkit.core.lr's numbers (the adapters: test_lr_schedules.py)."""

import math
import re

import pytest

from hvdkit.core import ConfigError, lr_scale, scaled_lr, warmup_factor


def test_rules_scale_by_size_by_its_square_root_or_not_at_all():
    assert [lr_scale(4, r) for r in ("linear", "sqrt", "none")] == [4.0, 2.0, 1.0]
    assert scaled_lr(0.1, "linear", size=2) == 0.2
    assert scaled_lr(0.1, "sqrt", size=2) == 0.1 * math.sqrt(2)
    assert scaled_lr(0.1, size=1) == 0.1


def test_warmup_rises_linearly_from_one_to_the_scale_then_stays():
    assert [warmup_factor(s, 4, 2.0) for s in range(7)] == [1.0, 1.25, 1.5, 1.75, 2.0, 2.0, 2.0]
    assert warmup_factor(2, 4, math.sqrt(2)) == 1.0 + (math.sqrt(2) - 1.0) / 2
    assert warmup_factor(0.5, 1, 3.0) == 2.0  # fractional steps (epoch-based warmup)
    assert warmup_factor(0, 0, 2.0) == 2.0  # no warmup: scaled from the first step


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: lr_scale(2, "cubic"), "rule must be one of 'linear', 'sqrt', 'none' (got 'cubic')"),
        (lambda: lr_scale(0, "linear"), "size must be an integer >= 1, the number of ranks (got 0)"),
        (lambda: scaled_lr(-0.1, size=2), "base_lr must be a finite number > 0 (got -0.1)"),
        (lambda: scaled_lr(math.nan, size=2), "base_lr must be a finite number > 0 (got nan)"),
        (lambda: scaled_lr(0.1, "linear"), "scaled_lr needs size=, the number of ranks"),
        (lambda: warmup_factor(1, -3, 2.0), "warmup_steps must be an integer >= 0 (got -3)"),
        (lambda: warmup_factor(1, 2.5, 2.0), "warmup_steps must be an integer >= 0 (got 2.5)"),
        (lambda: warmup_factor(-1, 4, 2.0), "step must be a number >= 0"),
    ],
)
def test_bad_rules_and_numbers_are_rejected_with_the_value(call, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        call()

"""Learning-rate policy for N ranks: how far to scale the single-process rate, and how to warm up to it.

N ranks with a per-rank batch of b train on a global batch of N*b, so the single-process rate
``base_lr`` (tuned for batch b) is usually scaled:

- ``"linear"``: ``base_lr * N`` (Goyal et al. 2017, "Accurate, Large Minibatch SGD"; the rule for SGD);
- ``"sqrt"``: ``base_lr * sqrt(N)`` (Hoffer et al. 2017; often preferred for Adam-type optimizers);
- ``"none"``: ``base_lr``.

Warmup (Goyal et al.): the rate starts at ``base_lr`` and rises linearly to ``base_lr * scale`` over
the first ``warmup_steps`` optimizer steps, then stays there. Any user schedule multiplies on top:
``lr(step) = base_lr * warmup_factor(step, warmup_steps, scale) * user_factor(step)``.
The framework adapters apply exactly these numbers: ``scaled_lr`` (a number; in every adapter),
``hvdkit.torch.ScaledLRScheduler`` (a torch scheduler), ``hvdkit.keras.ScaledLRSchedule`` (a Keras
schedule) and ``hvdkit.keras.LearningRateWarmupCallback``.
"""

from __future__ import annotations

import math

from .deprecation import warn_renamed
from .errors import ConfigError
from .options import check_int_at_least, check_number_above, check_number_at_least, check_positive_int

__all__ = ["RULES", "check_rule", "check_warmup_steps", "lr_scale", "scaled_lr", "warmup_factor"]

RULES = ("linear", "sqrt", "none")


def check_rule(rule: str) -> str:
    """``rule`` if it names a scaling rule hvdkit knows, else ConfigError."""
    if rule not in RULES:
        raise ConfigError(
            f"rule must be one of {', '.join(map(repr, RULES))} (got {rule!r}); "
            "'linear' for SGD (lr * size), 'sqrt' for Adam-type optimizers (lr * sqrt(size)), 'none' to keep lr"
        )
    return rule


def check_warmup_steps(warmup_steps: int, what: str = "warmup_steps") -> int:
    """``warmup_steps`` if it is an int >= 0, else ConfigError naming ``what``."""
    return check_int_at_least(what, warmup_steps, 0, "0 means no warmup")


def lr_scale(size: int, rule: str = "linear") -> float:
    """The factor ``rule`` scales the single-process learning rate by on ``size`` ranks.

    >>> lr_scale(4, "linear"), lr_scale(4, "sqrt"), lr_scale(4, "none")
    (4.0, 2.0, 1.0)
    """
    check_rule(rule)
    check_positive_int("size", size, what="an integer >= 1, the number of ranks")
    if rule == "linear":
        return float(size)
    if rule == "sqrt":
        return math.sqrt(size)
    return 1.0


def scaled_lr(base_lr: float, rule: str = "linear", size: int | None = None) -> float:
    """The learning rate for ``size`` ranks: ``base_lr * lr_scale(size, rule)``.

    ``base_lr`` is the rate tuned for one process with the per-rank batch. The adapters'
    ``scaled_lr`` (``hvdkit.torch``, ``hvdkit.tensorflow``, ``hvdkit.keras``) take the same arguments
    and default ``size`` to the job's; here it must be given.

    >>> scaled_lr(0.1, "sqrt", size=4)
    0.2
    """
    if isinstance(rule, int) and not isinstance(rule, bool):  # the old order scaled_lr(base_lr, size, rule)
        warn_renamed("hvdkit.core.scaled_lr(base_lr, size, rule)", "scaled_lr(base_lr, rule, size=size)")
        rule, size = ("linear" if size is None else size), rule
    if size is None:
        raise ConfigError("scaled_lr needs size=, the number of ranks (the adapters' scaled_lr use the job's)")
    return check_number_above("base_lr", base_lr) * lr_scale(size, rule)


def warmup_factor(step: float, warmup_steps: int, scale: float) -> float:
    """The multiplier of ``base_lr`` at optimizer step ``step`` (0 is the first step).

    1 at step 0, rising linearly to ``scale`` at step ``warmup_steps``, ``scale`` from then on
    (and at every step when ``warmup_steps`` is 0). ``step`` may be fractional (epochs-based warmup).

    >>> [warmup_factor(s, 4, 2.0) for s in range(6)]
    [1.0, 1.25, 1.5, 1.75, 2.0, 2.0]
    """
    check_warmup_steps(warmup_steps)
    scale = check_number_above("scale", scale)
    check_number_at_least("step", step, what="a number >= 0, the count of optimizer steps taken")
    if warmup_steps == 0 or step >= warmup_steps:
        return scale
    return 1.0 + (scale - 1.0) * step / warmup_steps

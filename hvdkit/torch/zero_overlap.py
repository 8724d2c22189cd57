"""ZeRO-1's gradient reduce-scatter overlapped with the backward pass (``hvdkit.torch.zero``).

A round of the reduce-scatter (``hvdkit.core.zero.plan_rounds``) needs the gradients of every
parameter that any rank's part of it covers. When the last of them has received its
``backward_passes_per_step``-th gradient (a post-accumulate-grad hook), the round is packed and
handed to Horovod's asynchronous grouped reduce-scatter while the backward pass goes on, as
Horovod's own optimizer does with its allreduces. At most ``max_in_flight`` rounds are in flight:
one more waits for the oldest to finish, so the temporaries stay bounded.

Every rank starts the rounds in one order, ``round_order`` (the last round first, as backward
produces the gradients of the last parameters first), from the hooks and in ``step()`` alike: a
round whose gradients are complete waits until the rounds before it in that order have started. So
a rank that waits for a round (the in-flight limit, or ``step()``) has started every round before
it, and so has every other rank that waits: the earliest round any rank waits for has been started
by all of them, and finishes. Without the order, ranks whose gradients complete in another order
(branches run in a data-dependent order, a layer one rank's batch does not reach) each wait in a hook
for a round the other starts only later, and the job hangs. The price: a round whose parameters get
no gradient on this rank (an unused layer) leaves the rounds after it in that order to ``step()``.
A finished round's
averaged part is written into this rank's slice of the gradient buffer at once: those gradients
are complete. ``step()`` waits for the rounds still in flight and reduces the others itself
(rounds whose parameters got no gradient, or were given new storage since the last step).

More ``backward()`` passes than ``backward_passes_per_step`` before ``step()`` is an error, as in
Horovod: a round already sent cannot take the later gradients.
"""

from __future__ import annotations

import bisect
import weakref
from typing import Any

from ..core.errors import ConfigError
from ..core.zero import rank_parts

# The optimizer these rounds belong to: a hvdkit.torch.zero.ShardedOptimizer (not imported: zero imports this).
# What they use of it is public: flat_groups, round_plan(), start_round(), finish_round(), drop_round(),
# early_rounds, check_trainable(), backward_passes_per_step, round_elements and overlap.
ShardedOptimizer = Any

__all__ = ["EarlyRounds", "MAX_IN_FLIGHT", "round_order"]

# Rounds of the reduce-scatter in flight at once during backward (each at most round_elements elements):
# on 2 cores 4 in flight ran up to 8 % slower than 1 or 2 (their packing and reducing compete for the cores).
MAX_IN_FLIGHT = 2


def round_order(count: int) -> list[int]:
    """The order in which every rank starts ``count`` rounds, in backward and in ``step()``: the last first."""
    return list(range(count - 1, -1, -1))


class EarlyRounds:
    """The rounds of one sharded optimizer's reduce-scatter started during backward, until its next ``step()``."""

    def __init__(self, optimizer: ShardedOptimizer) -> None:
        self._optimizer = weakref.ref(optimizer)
        self._plan_key: Any = None  # the round_elements the plan below was made for
        self._layout: Any = None  # the optimizer's (active groups, rounds) for that round_elements
        self._by_index: dict[int, Any] = {}  # param group index -> its FlatGroup
        self._params_of: list[list[tuple[int, int]]] = []  # round -> the (group index, parameter) it needs
        self._rounds_of: dict[tuple[int, int], list[int]] = {}  # (group index, parameter) -> its rounds
        self.max_in_flight = MAX_IN_FLIGHT
        self.reset()
        for g in optimizer.flat_groups:
            self.watch(g)

    def watch(self, group: Any) -> None:
        """Hear the gradients of ``group`` (a ``FlatGroup``) from now on; the rounds are planned anew."""
        for i, p in enumerate(group.params):
            p.register_post_accumulate_grad_hook(_Arrived(self, group.index, i))
        self._plan_key = None

    def busy(self) -> bool:
        """True once a gradient arrived since the last ``step()`` or ``zero_grad()`` (rounds may have started)."""
        return bool(self._passes or self._in_flight or self.finished)

    def reset(self) -> None:
        """Forget the passes counted and the rounds started (after ``step()``; in flight ones: ``drain`` first)."""
        self._passes: dict[tuple[int, int], int] = {}
        self._waiting: list[int] | None = None
        self._ready: set[int] = set()  # rounds whose gradients are complete, started or not
        self._next = 0  # position in round_order of the next round to start
        self._in_flight: dict[int, Any] = {}  # round -> Horovod handle, in the order started
        self.finished: set[int] = set()  # rounds whose averaged part is already in the gradient buffer
        self.started = 0

    def arrived(self, optimizer: ShardedOptimizer, group: int, i: int) -> None:
        """Parameter ``i`` of param group ``group`` has a gradient: start the rounds it completes."""
        g = optimizer.flat_groups[group]
        if not g.holds(i, g.params[i].data, g.flat):
            return  # another sharded optimizer took the parameter over (rebuilt): its hooks count, not these
        if not self._passes:  # the first gradient of a step: refuse a parameter unfrozen since, before any round
            optimizer.check_trainable()
        key = (group, i)
        n = self._passes.get(key, 0) + 1
        self._passes[key] = n
        passes = optimizer.backward_passes_per_step
        if n > passes:
            raise ConfigError(
                f"backward() ran {n} times on parameter {i} of param group {group} before step(), but the "
                f"sharded optimizer reduces after backward_passes_per_step={passes} passes: pass "
                f"hk.DistributedOptimizer(..., backward_passes_per_step={n}) to accumulate {n} passes, "
                "or call step() (or zero_grad()) after each"
            )
        if n < passes:
            return
        self._plan(optimizer)
        for r in self._rounds_of.get(key, ()):
            self._waiting[r] -= 1
            if self._waiting[r] == 0:
                self._ready.add(r)
        order = self._order
        while self._next < len(order) and order[self._next] in self._ready:  # in round_order only
            if not self._start(optimizer, order[self._next]):
                self._next = len(order)  # it and every round after it are left to step()
                return
            self._next += 1

    def _plan(self, optimizer):
        """Which parameters each round needs, made once per ``round_elements`` (the rounds are the step's)."""
        if optimizer.round_elements != self._plan_key:
            self._plan_key = optimizer.round_elements
            self._layout = optimizer.round_plan()
            groups, rounds = self._layout
            self._by_index = {g.index: g for g in optimizer.flat_groups}
            self._params_of, self._rounds_of = [], {}
            self._order = round_order(len(rounds))
            for r, round_ in enumerate(rounds):
                needed = set()
                for piece in round_:
                    g = groups[piece.group]
                    for a, b in rank_parts(g.bounds, piece):
                        first = bisect.bisect_right(g.offsets, a) - 1
                        for i in range(max(first, 0), len(g.params)):
                            if g.offsets[i] >= b:
                                break
                            if g.offsets[i + 1] > a:
                                needed.add((g.index, i))
                self._params_of.append(sorted(needed))
                for key_ in needed:
                    self._rounds_of.setdefault(key_, []).append(r)
        if self._waiting is None:
            self._waiting = [len(p) for p in self._params_of]

    def _start(self, optimizer, r):
        """Start round ``r``; False (not started) where a gradient is not the buffer's view (``step()`` reduces it)."""
        for gi, i in self._params_of[r]:
            g = self._by_index[gi]
            p = g.params[i]
            if not (g.holds(i, p.data, g.flat) and p.grad is not None and g.holds(i, p.grad, g.grads)):
                return False
        # every rank started the oldest before this one (round_order), so waiting for it cannot hang
        while len(self._in_flight) >= self.max_in_flight:
            self.finish(optimizer, next(iter(self._in_flight)))
        groups, rounds = self._layout
        self._in_flight[r] = optimizer.start_round(groups, rounds[r], r)
        self.started += 1
        return True

    def in_flight(self, r: int) -> bool:
        """True while round ``r`` was started and not yet finished."""
        return r in self._in_flight

    def finish(self, optimizer: ShardedOptimizer, r: int) -> None:
        """Wait for round ``r`` and write this rank's averaged part into the gradient buffer."""
        groups, rounds = self._layout
        optimizer.finish_round(groups, rounds[r], self._in_flight.pop(r))
        self.finished.add(r)

    def drain(self, optimizer: ShardedOptimizer) -> None:
        """Wait for every round in flight and drop what they reduced (``zero_grad()`` before ``step()``)."""
        for r in list(self._in_flight):
            optimizer.drop_round(self._in_flight.pop(r))
        self.reset()


class _Arrived:
    """The post-accumulate-grad hook of one parameter: tells its ``EarlyRounds`` (held weakly)."""

    def __init__(self, rounds: EarlyRounds, group: int, i: int) -> None:
        self.rounds = weakref.ref(rounds)
        self.group, self.i = group, i

    def __call__(self, param: Any) -> None:
        rounds = self.rounds()
        optimizer = rounds._optimizer() if rounds is not None else None
        if optimizer is None or not optimizer.overlap or optimizer.early_rounds is not rounds:
            return
        rounds.arrived(optimizer, self.group, self.i)

"""In-process recovery's framework-free parts, one copy for ``hk.elastic`` of torch and of Keras.

``CommittedState`` is what the two ``hk.elastic.State`` classes share: the keyword values a commit holds, the
count of steps since the last commit, the driver's notices of hosts added or removed and the decision of
every rank alike to act on them, and the list of recoveries made. ``recover_in_process`` is
``hk.elastic.run``'s loop; ``reset_with_retries``, ``begin_recovery`` and ``say_recovered`` are its steps around a
reset. ``CommitSchedule`` says which steps commit (a number of steps, or ``"auto"``: measured), for the torch
Trainer and Keras's ``hk.elastic.fit`` alike. The adapters hold what depends on the framework (what is copied at
a commit, how it is shared, Horovod's exceptions), and pass in what these need of it (the communicator, the
world size, the rank).
"""

from __future__ import annotations

import math
import queue
import time
from collections.abc import Callable
from typing import Any

from .comm import Communicator
from .errors import CollectiveError, ConfigError
from .log import get_logger
from .options import AUTO, check_positive_int
from .preemption import hold_stop_signals

__all__ = [
    "AUTO_BUDGET",
    "AUTO_MOST",
    "AUTO_PROBE",
    "RESET_ATTEMPTS",
    "CommitSchedule",
    "CommittedState",
    "RankWatch",
    "check_commit_every",
    "begin_recovery",
    "rank0_takeover",
    "recover_in_process",
    "reset_with_retries",
    "say_recovered",
]

_log = get_logger("elastic")
RESET_ATTEMPTS = 5  # tries in a row to form the ring again, each failed by a worker lost meanwhile
AUTO_BUDGET = 0.02  # commit_every="auto": commits may cost this share of the training time
AUTO_PROBE = 5  # ... measured over this many steps, each committed
AUTO_MOST = 1000  # never fewer commits than one per this many steps


class CommittedState:
    """The shared part of ``hk.elastic.State``: keyword ``values`` as attributes (``state.epoch``; committed by
    value), ``seed``, ``on_resize``, ``on_start``, the commit counter and the host notices. A subclass
    provides ``save()`` (copy its state into host memory, then ``_saved()``) and ``check_host_updates()``
    (``_host_update`` with Horovod's values, raising Horovod's ``HostsUpdatedInterrupt``)."""

    def __init__(
        self,
        *,
        seed: int = 0,
        on_resize: Callable[[int], Any] | None = None,
        on_start: Callable[[], Any] | None = None,
        values: dict[str, Any],
    ) -> None:
        for name in values:
            if name.startswith("_") or hasattr(type(self), name):
                raise ConfigError(f"State value {name!r} would hide an attribute of hk.elastic.State; rename it")
        self.seed = seed
        self.on_resize = on_resize
        self.on_start = on_start
        self._names = tuple(values)
        for name, value in values.items():
            setattr(self, name, value)
        self._commit: dict[str, Any] | None = None
        self._commit_id = 0
        self._since_commit = 0
        self._messages: queue.Queue = queue.Queue()
        self._last_update = 0
        self.recoveries: list[dict[str, Any]] = []  # one entry per recovery: cause, sizes, step, seconds

    @property
    def values(self) -> dict[str, Any]:
        """The keyword values, as now (not as committed)."""
        return {name: getattr(self, name) for name in self._names}

    def save(self) -> None:  # pragma: no cover - each adapter's State has its own
        raise NotImplementedError

    def check_host_updates(self) -> None:  # pragma: no cover - each adapter's State has its own
        raise NotImplementedError

    def sync(self) -> None:  # pragma: no cover - each adapter's State has its own
        raise NotImplementedError

    def restore(self) -> None:  # pragma: no cover - each adapter's State has its own
        raise NotImplementedError

    def commit(self) -> None:
        """Copy the state into host memory, then let a waiting worker join (it may raise Horovod's
        ``HostsUpdatedInterrupt``, which ``run`` handles). Collective: every rank calls it alike."""
        self.save()
        self.check_host_updates()

    def commit_every(self, steps: int) -> bool:
        """Count a step; every ``steps``-th call commits (``commit()``). True when it committed. Collective."""
        self._since_commit += 1
        if self._since_commit < steps:
            return False
        self.commit()
        return True

    def _saved(self, commit: dict[str, Any]) -> None:
        """``save()``'s last step: ``commit`` (without its id) is now this rank's newest commit."""
        self._commit_id += 1
        self._commit = {"id": self._commit_id, **commit}
        self._since_commit = 0

    def on_hosts_updated(self, timestamp: float, update_res: Any) -> None:
        """Horovod's worker notification service: the driver has workers to add or remove."""
        self._messages.put((timestamp, update_res))

    def _host_update(self, comm: Communicator, no_update: int, removed: int) -> bool | None:
        """Whether the ranks act on a host update now, decided alike on every rank (collective): None for no;
        else whether the update only removed hosts (``HostsUpdatedInterrupt``'s argument). ``no_update``,
        ``removed``: Horovod's ``HostUpdateResult`` values.

        Any rank may have heard of it: the newest notice over all ranks decides, measured against the newest
        update any rank has acted on. A worker that has just joined acted on none (0): against its own 0, the
        update it joined by would look new to it alone, and it alone would reset at the next commit (the others
        then saw "Horovod has been shut down")."""
        newest, update = self._last_update, no_update
        while not self._messages.empty():
            timestamp, result = self._messages.get()
            if timestamp > newest:
                newest, update = timestamp, update | int(result)
        seen = comm.allgather_object((self._last_update, newest, int(update)), name="hvdkit.elastic.hosts")
        acted = max(a for a, _, _ in seen)
        latest = max(t for _, t, _ in seen)
        self._last_update = max(acted, latest)
        if latest <= acted:
            return None
        merged = 0
        for _, t, u in seen:
            if t > acted:
                merged |= u
        return merged == removed

    def on_reset(self) -> None:
        """After Horovod re-formed the ring (``run`` calls it): forget host messages of the old ring."""
        self._messages = queue.Queue()


def recover_in_process(
    attempt: Callable[[], Any],
    state: CommittedState,
    *,
    joins: type[BaseException],
    is_lost: Callable[[BaseException], bool],
    begin: Callable[[str, BaseException | None], Any],
    reset: Callable[[], Any],
    recovered: Callable[[], Any],
) -> Any:
    """``hk.elastic.run``'s loop under in-process recovery, one copy for torch and Keras: ``state.sync()``, then
    ``recovered()`` (the recovery that ends there, logged), then ``attempt()`` (the training), whose value it
    returns. A join (``joins``: Horovod's ``HostsUpdatedInterrupt``) or a lost worker (an error ``is_lost`` says
    is one; the state goes back to its last commit) starts a recovery (``begin(cause, error)``), ``reset()``
    forms the ring again, and the loop goes on; any other error is raised as it is. A stop signal that comes
    while no ``PreemptionGuard`` is installed (the sync, a reset) is held for the next guard made
    (``hold_stop_signals``): its default action would end the process, and the steps since the last checkpoint.
    Collective: every rank runs it alike."""
    with hold_stop_signals():
        while True:
            try:
                state.sync()
                recovered()
                return attempt()
            except joins:
                begin("workers join", None)
            except Exception as e:
                if not is_lost(e):
                    raise
                begin("a worker was lost", e)
                state.restore()
            reset()


def reset_with_retries(
    restart: Callable[[], Any],
    lost: type[BaseException],
    state: CommittedState,
    then: str = "start it again, and check why workers keep failing",
) -> None:
    """``restart()`` (Horovod shut down and started again: the driver's next rendezvous forms the new ring). A
    worker lost while it forms makes ``hvd.init()`` raise ``lost`` (HorovodInternalError; engine fix 17): try
    again, the driver answers without that worker, at most ``RESET_ATTEMPTS`` times; each failed try is counted
    in the recovery being made (``state.recoveries[-1]["failed_resets"]``). Then a CollectiveError that ends with
    ``then`` (what to do)."""
    for attempt in range(1, RESET_ATTEMPTS + 1):
        try:
            restart()
            return
        except lost as e:
            if attempt == RESET_ATTEMPTS:
                raise CollectiveError(
                    f"in-process recovery gave up: the ring could not be formed again {attempt} times in a row, "
                    f"each time because a worker was lost while it formed ({e}); the job ends here: {then}"
                ) from e
            if state.recoveries:
                state.recoveries[-1]["failed_resets"] = attempt
            _log.warning(
                "a worker was lost while the ring formed again (%s); trying again (%d of %d)",
                e,
                attempt,
                RESET_ATTEMPTS,
            )


def begin_recovery(state: CommittedState, cause: str, size: int, rank: int, error: str | None) -> None:
    """A recovery starts (``cause``: "a worker was lost", "workers join"), at world size ``size``; a lost worker
    (``error``, one line) is logged by every rank."""
    state.recoveries.append(
        {"cause": cause, "from_size": size, "t0": time.monotonic(), "step": getattr(state, "step", None)}
    )
    if error is not None:
        _log.warning("rank %d: %s (%s); going back to the last commit", rank, cause, error)


def say_recovered(state: CommittedState, size: int, is_rank0: bool) -> None:
    """After the sync that ends a recovery: its time, the new size and the step it goes on from; logged on
    rank 0. Nothing when no recovery is under way."""
    if not state.recoveries or "seconds" in state.recoveries[-1]:
        return
    last = state.recoveries[-1]
    last["seconds"] = time.monotonic() - last["t0"]
    last["to_size"] = size
    last["resumed_step"] = getattr(state, "step", None)
    if is_rank0:
        failed = last.get("failed_resets")
        _log.info(
            "%s: %d -> %d ranks, going on from step %s (committed in memory) after %.2f s",
            last["cause"] + (f" ({failed} failed reset(s): a worker lost while the ring formed)" if failed else ""),
            last["from_size"],
            last["to_size"],
            last["resumed_step"],
            last["seconds"],
        )


def rank0_takeover(rank: int, last: int | None, joined: bool) -> str | None:
    """How the process that is rank 0 after a sync came to be rank 0, or None when it took nothing over.

    ``last``: this process's rank after its previous sync (None: this is its first); ``joined``: its first sync
    took another rank's commit (a worker that came into a running job) instead of starting the job. ``"was rank
    R"`` for a process that was another rank (rank 0 was lost); ``"a worker that joined"`` for one that has just
    joined and was given rank 0 (Horovod's elastic driver gives ranks host by host, in the order the hosts were
    first assigned: new workers on the first host come before the running workers of the hosts after it).
    """
    if rank != 0 or last == 0:
        return None
    if last is None:
        return "a worker that joined" if joined else None
    return f"was rank {last}"


class RankWatch:
    """This process's rank from one sync to the next, for the process that becomes rank 0 to say so
    (``rank0_takeover``). Call ``started()`` from the ``on_start`` of the job's start, ``after_sync(rank)``
    after every sync (the start's included). No collective."""

    def __init__(self) -> None:
        self.last: int | None = None
        self.began = False  # this process started the job (not a worker that joined it)

    def started(self) -> None:
        """The sync that runs ``on_start``: this process is one the job started with."""
        self.began = True

    def after_sync(self, rank: int) -> str | None:
        """``rank0_takeover`` for ``rank`` now; ``rank`` is the last rank from here on."""
        note = rank0_takeover(rank, self.last, joined=not self.began)
        self.last = rank
        return note


def check_commit_every(value: Any) -> int | str:
    """``value`` if it is ``"auto"`` or an int >= 1 (not a bool), else ConfigError naming it and the fix."""
    if isinstance(value, str) and value == AUTO:
        return value
    return check_positive_int(
        "commit_every",
        value,
        f"pass 'auto' (commits cost at most {100 * AUTO_BUDGET:g} % of the time) or a number of optimizer steps, "
        "e.g. 50",
    )


class CommitSchedule:
    """Which steps commit: every ``every`` steps (counted from the last sync), or ``"auto"``: every step for the
    first ``AUTO_PROBE`` steps while the time of a step and of a commit are measured, then every ``n`` steps where
    ``n`` is the fewest that keeps commits under ``AUTO_BUDGET`` of the time (the largest over ranks; at most
    ``AUTO_MOST``), logged on rank 0. ``comm``: the communicator, or a function of no arguments that returns the
    one of now (the adapter's ``runtime.communicator``); ``clock``: seconds, as ``time.perf_counter``.
    Collective: every rank calls ``due`` after every step alike, ``commit`` when it says so, and ``restart``.
    """

    def __init__(
        self,
        every: int | str,
        comm: Communicator | Callable[[], Communicator],
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        check_commit_every(every)
        self.every = None if every == AUTO else int(every)
        self._comm, self._clock = comm, clock
        self._count = 0
        self._probe: list[float] = []  # step seconds while probing, commits left out
        self._commits: list[float] = []  # commit seconds while probing
        self._last: float | None = None

    def _communicator(self) -> Communicator:
        return self._comm if isinstance(self._comm, Communicator) else self._comm()

    def due(self) -> bool:
        """After a step: True when this step commits (then call ``commit``)."""
        now = self._clock()
        self._count += 1
        if self.every is not None:
            return self._count % self.every == 0
        if self._last is not None:
            self._probe.append(now - self._last)
        self._last = now
        return True  # probing: every step commits

    def commit(self, fn: Callable[[], Any]) -> None:
        """Run the commit ``fn`` (collective), timed; at the end of the probe, decide ``n`` (collective)."""
        t0 = self._clock()
        fn()
        seconds = self._clock() - t0
        if self.every is not None:
            return
        self._commits.append(seconds)
        if self._last is not None:
            self._last += seconds  # a step's time leaves the commit out
        if len(self._probe) < AUTO_PROBE:
            return
        step = sum(self._probe) / len(self._probe)
        commit = sum(self._commits) / len(self._commits)
        wanted = max(1, min(AUTO_MOST, math.ceil(commit / max(AUTO_BUDGET * step, 1e-9))))
        comm = self._communicator()
        self.every = max(comm.allgather_object(wanted, name="hvdkit.elastic.every"))
        if comm.is_rank0:
            _log.info(
                "in-process recovery: a commit takes %.1f ms, a step %.1f ms: committing every %d step(s) "
                "(at most %g%% of the time; set commit_every to choose)",
                1e3 * commit,
                1e3 * step,
                self.every,
                100 * AUTO_BUDGET,
            )
        self._count = 0

    def restart(self) -> None:
        """After every sync (the start, a recovery, a join): count from the commit every rank now holds, with
        the ``n`` the ranks that had decided it use (a new worker takes it; none decided: all probe anew).
        Collective."""
        decided = max(self._communicator().allgather_object(self.every or 0, name="hvdkit.elastic.every"))
        if decided:
            self.every = decided
        self._probe, self._commits, self._count, self._last = [], [], 0, None

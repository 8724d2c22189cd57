"""The state of ZeRO-1's torch optimizer (``hvdkit.torch.zero``), saved, loaded and shared as the unsharded one's.

``ShardedOptimizerState`` is the base class of ``hvdkit.torch.zero.ShardedOptimizer``: the step
lives there, the state here, and the import runs one way (``zero`` imports this module, never the
reverse). The state is the inner optimizer's, over this rank's slices (``FlatGroup.shard``); what
leaves the optimizer is the unsharded optimizer's state dict, the same at any world size:
``consolidate_state_dict`` gathers it in rounds of at most ``chunk_elements`` elements,
``load_state_dict`` keeps this rank's slice of one, ``share_state`` sends each rank its slice of one
rank's. It satisfies ``hvdkit.core.zero.ShardedState`` (``consolidate``, ``load_unsharded``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from ..core.errors import CollectiveError, ConfigError
from ..core.options import check_positive_int
from ..core.zero import pack_rounds, partition, spans
from .state import join_tensors, raise_unless_all_fit, split_tensors, tensor_specs

if TYPE_CHECKING:
    from ..core.comm import Communicator

__all__ = ["ShardedOptimizerState", "elements"]


class ShardedOptimizerState(torch.optim.Optimizer):
    """The state half of a sharded optimizer (ZeRO stage 1): its state saved, loaded and shared as the unsharded one's.

    Not built alone: its subclass ``hvdkit.torch.zero.ShardedOptimizer`` (the step) sets what these
    methods read: ``_rank``, ``_size``, ``_hvd`` (``horovod.torch``), ``_groups`` (one ``FlatGroup``
    per param group), ``_inner`` (the user's optimizer class over the slices), ``_frozen_state``
    (frozen parameters' state, kept whole), ``_consolidated`` and ``_consolidated_to`` (the whole
    state and the rank it was gathered to), ``chunk_elements``, ``last_consolidation``, ``last_scatter``.

    ``state_dict()`` is the unsharded optimizer's, the same at any world size: call
    ``consolidate_state_dict()`` on every rank first (``hk.Checkpointer.save`` does); it gathers the
    state to rank 0 in rounds of at most ``chunk_elements`` elements (``to=None``: to every rank).
    After ``load_state_dict`` (which keeps this rank's slice) it is available until the next ``step()``.
    """

    @staticmethod
    def _hyper(group):
        return {k: v for k, v in group.items() if k != "params"}

    @staticmethod
    def _probe_keys(cls, group, sgroup):
        """The state keys ``cls`` keeps per element (shaped like the parameter), found on a throwaway tensor."""
        t = torch.zeros(2, dtype=sgroup.shard.dtype, device=sgroup.shard.device)
        t.grad = torch.zeros_like(t)
        probe = cls([dict(ShardedOptimizerState._hyper(group), params=[t])])
        probe.step()
        return [k for k, v in probe.state[t].items() if isinstance(v, torch.Tensor) and v.shape == t.shape]

    def _indices(self):
        """Each parameter's index in a torch state dict (numbered through every group, frozen ones too)."""
        return {id(p): i for i, p in enumerate(p for g in self.param_groups for p in g["params"])}

    def consolidate_state_dict(self, to: int | None = 0) -> None:
        """Gather the whole optimizer state on rank ``to`` (None: on every rank), for its next ``state_dict()``.

        The per-element state goes in rounds of at most ``chunk_elements`` elements: each round is one
        grouped all-gather in which only the owners of its pieces send, and the ranks that do not keep
        the state drop what they receive at once, so their extra memory is one round's worth, not the
        whole state (``last_consolidation`` says how much each round brought and what was kept).
        Collective: every rank calls it alike (before ``state_dict()`` after a ``step()``).
        """
        if to is not None and (isinstance(to, bool) or not isinstance(to, int) or not 0 <= to < self._size):
            raise ConfigError(f"to must be a rank in [0, {self._size}) or None (got {to!r})")
        chunk = self.chunk_elements
        check_positive_int("chunk_elements", chunk)
        keep = to is None or to == self._rank
        index = self._indices()
        owned = [(g, self._inner.state.get(g.shard, {})) for g in self._groups]
        # Per-element state is shaped like the 1-D shard, scalars (step counts) are 0-D: the same keys on
        # every rank, even where a slice is empty. Every shard steps, so every rank has state alike.
        owned = [(g, [k for k, v in own.items() if _is_slice(v)], own) for g, own in owned if own]
        wholes, pieces = {}, []  # pieces: (whole or None, start, stop, this rank's part or an empty tensor)
        for gi, (g, keys, own) in enumerate(owned):
            bounds = partition(g.offsets[-1], self._size)
            for k in keys:
                mine = own[k].reshape(-1)
                whole = mine.new_empty(g.offsets[-1]) if keep else None
                wholes[gi, k] = whole
                for r, (a, b) in enumerate(bounds):
                    for lo in range(a, b, chunk):
                        hi = min(lo + chunk, b)
                        part = mine[lo - a : hi - a] if r == self._rank else mine.new_empty(0)
                        pieces.append((whole, lo, hi, part))
        # the pieces (each <= chunk) packed into rounds of <= chunk elements
        rounds = [[pieces[j] for j in round_] for round_ in pack_rounds([p[2] - p[1] for p in pieces], chunk)]
        largest = 0
        for i, round_ in enumerate(rounds):
            outs = self._hvd.grouped_allgather([p[3] for p in round_], name=f"hvdkit.zero.state.{i}")
            largest = max(largest, sum(o.numel() for o in outs))
            if keep:
                for (whole, lo, hi, _), out in zip(round_, outs, strict=True):
                    whole[lo:hi].copy_(out)
            del outs  # dropped at once where the state is not kept
        self.last_consolidation = {
            "to": to,
            "rounds": len(rounds),
            "largest_round": largest,
            "kept": sum(w.numel() for w in wholes.values()) if keep else 0,
        }
        if not keep:
            self._consolidated, self._consolidated_to = None, to
            return
        state = {}
        for gi, (g, keys, own) in enumerate(owned):
            whole = {k: g.unflatten(wholes[gi, k]) for k in keys}
            for pi, p in enumerate(g.params):
                state[index[id(p)]] = {
                    k: whole[k][pi] if k in whole else (v.clone() if isinstance(v, torch.Tensor) else v)
                    for k, v in own.items()
                }
        for p, own in self._frozen_state.items():
            state[index[id(p)]] = {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in own.items()}
        self._consolidated, self._consolidated_to = state, to

    def state_dict(self) -> dict[str, Any]:
        """The unsharded optimizer's state dict: ``state`` by parameter index, the user's ``param_groups``.

        Needs ``consolidate_state_dict()`` since the last ``step()`` on more than one rank (a
        ConfigError says so otherwise); no collective.
        """
        if self._consolidated is None:
            if self._consolidated_to is not None:
                raise ConfigError(
                    f"state_dict() of a sharded optimizer: the state was consolidated to rank {self._consolidated_to}, "
                    f"not this rank ({self._rank}); call state_dict() there, or consolidate_state_dict(to=None) for "
                    "every rank"
                )
            if self._size > 1:
                raise ConfigError(
                    "state_dict() of a sharded optimizer needs consolidate_state_dict() on every rank after the "
                    "last step() (hk.Checkpointer.save does it)"
                )
            self.consolidate_state_dict()
        index = self._indices()
        groups = [dict(self._hyper(g), params=[index[id(p)] for p in g["params"]]) for g in self.param_groups]
        return {"state": dict(self._consolidated), "param_groups": groups}

    def consolidate(self, to: int | None = 0) -> dict[str, Any] | None:
        """``ShardedState``'s gather (``hvdkit.core.zero``): ``consolidate_state_dict(to)``, then ``state_dict()``.

        Returns the unsharded optimizer's state dict on rank ``to`` (None: every rank), None on the others.
        Collective: every rank calls it alike.
        """
        self.consolidate_state_dict(to)
        return self.state_dict() if to is None or to == self._rank else None

    def load_unsharded(self, state: dict[str, Any]) -> None:
        """``hvdkit.core.zero.ShardedState``'s load: the same as ``load_state_dict(state)``. No collective."""
        self.load_state_dict(state)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Load an unsharded optimizer state dict (from any world size); keep only this rank's slice.

        No collective. ``state_dict()`` returns it until the next ``step()``.
        """
        saved_groups, saved, entries, keys = self._layout(state_dict)
        inner_state = {
            gi: {k: (g.own([e[k] for e in entries[gi]]) if k in keys[gi] else v) for k, v in entries[gi][0].items()}
            for gi, g in enumerate(self._groups)
            if entries[gi] is not None
        }
        self._load_inner(saved_groups, saved, inner_state)
        self._consolidated, self._consolidated_to = saved, None

    def _layout(self, state_dict):
        """``(groups, state, entries, keys)`` of an unsharded state dict, checked against this optimizer.

        ``entries[gi]``: the state of group ``gi``'s trainable parameters in order (None: it has none);
        ``keys[gi]``: which of their state keys are per element (sharded).
        """
        saved_groups = state_dict["param_groups"]
        if len(saved_groups) != len(self.param_groups):
            raise ValueError("loaded state dict has a different number of parameter groups")
        if [len(g["params"]) for g in saved_groups] != [len(g["params"]) for g in self.param_groups]:
            raise ValueError(
                "loaded state dict contains a parameter group that doesn't match the size of optimizer's group"
            )
        saved = {int(k): v for k, v in state_dict["state"].items()}
        index = self._indices()
        # the saved hyperparameters decide which state is per element (SGD keeps a momentum buffer only with momentum)
        keys = [self._probe_keys(type(self._inner), s, g) for s, g in zip(saved_groups, self._groups, strict=True)]
        entries = []
        for gi, g in enumerate(self._groups):
            group = [saved.get(index[id(p)]) for p in g.params]
            if all(e is None for e in group):
                entries.append(None)
                continue
            if any(e is None for e in group):
                raise ValueError(
                    f"param group {gi} has state for some of its trainable parameters only; a sharded optimizer "
                    "needs state for all of them or none"
                )
            entries.append(group)
        return saved_groups, saved, entries, keys

    def _load_inner(self, saved_groups, saved, inner_state):
        """Make ``inner_state`` (this rank's slices) the inner optimizer's; the frozen state and hyperparameters too."""
        index = self._indices()
        inner_groups = [dict(self._hyper(s), params=[i]) for i, s in enumerate(saved_groups)]
        self._inner.load_state_dict({"state": inner_state, "param_groups": inner_groups})
        self.state = self._inner.state
        frozen = [p for g in self.param_groups for p in g["params"] if not p.requires_grad]
        self._frozen_state = {p: saved[index[id(p)]] for p in frozen if index[id(p)] in saved}
        for group, s in zip(self.param_groups, saved_groups, strict=True):
            group.update(self._hyper(s))

    def share_state(self, comm: Communicator, root: int = 0, error: type[Exception] = CollectiveError) -> None:
        """Give every rank its slice of ``root``'s whole state (after a restore on ``root``, or a fresh start).

        ``root`` must hold the whole state (after ``load_state_dict`` or ``consolidate_state_dict``).
        It sends a small header (hyperparameters, step counts, shapes) as an object, the per-element
        state as tensors: each rank receives only its own slice, in rounds of at most
        ``chunk_elements`` elements (one all-to-all each, in which only ``root`` sends), so no rank
        other than ``root`` ever holds more than its slice and one round (``last_scatter`` says how
        many rounds and elements each rank received). A failure on ``root``, or a rank whose optimizer
        does not fit, raises ``error`` on every rank. Collective: every rank calls it.
        """
        chunk = self.chunk_elements
        check_positive_int("chunk_elements", chunk)
        outcome, tensors = None, []
        if self._rank == root:
            try:
                outcome = ("ok", split_tensors(self.state_dict(), tensors))
            except Exception as e:  # noqa: BLE001 - any failure must reach every rank
                outcome = ("error", f"rank {root} could not describe its optimizer state ({type(e).__name__}: {e})")
        status, header = comm.broadcast_object(outcome, name="hvdkit.zero.header", root=root)
        if status != "ok":
            raise error(header)
        problem, layout = None, None
        try:
            layout = self._layout(header)
            for gi, (g, group) in enumerate(zip(self._groups, layout[2], strict=True)):
                for p, entry in zip(g.params, group, strict=True) if group is not None else ():
                    for k in layout[3][gi]:
                        if tuple(entry[k].shape) != tuple(p.shape):
                            raise ValueError(
                                f"state {k!r} of a parameter of group {gi} is {entry[k].shape}, not {p.shape}"
                            )
        except (ValueError, KeyError, AttributeError) as e:
            problem = str(e)
        raise_unless_all_fit(comm, problem, "hvdkit.zero.fit", error, f"rank {root}'s optimizer state", "optimizer")
        saved_groups, _, entries, keys = layout
        sliced = {id(e[k]) for gi, group in enumerate(entries) for e in group or [] for k in keys[gi]}
        small = [s for s in tensor_specs(header) if id(s) not in sliced]  # step counts, frozen parameters' state
        if self._rank != root:
            tensors = [None] * len(tensor_specs(header))
            for s in small:
                tensors[s.index] = torch.empty(s.shape, dtype=s.dtype, device=s.device)
        comm.broadcast_tensors([tensors[s.index] for s in small], name="hvdkit.zero.small", root=root)
        mine = self._scatter(entries, keys, tensors, root, chunk)
        if self._rank == root:
            return  # load_state_dict (or the consolidation) already gave it its slices
        state = join_tensors(header, tensors)
        saved = {int(k): v for k, v in state["state"].items()}
        index = self._indices()
        inner_state = {}
        for gi, g in enumerate(self._groups):
            if entries[gi] is None:
                continue
            first = saved[index[id(g.params[0])]]
            inner_state[gi] = {k: (mine[gi, k] if k in keys[gi] else v) for k, v in first.items()}
        self._load_inner(saved_groups, saved, inner_state)
        if any(e is not None for e in entries):
            self._consolidated, self._consolidated_to = None, root
        else:  # nothing per element (a fresh optimizer): the whole state is what every rank now holds
            self._consolidated, self._consolidated_to = saved, None

    def _device(self):
        return self._groups[0].shard.device if self._groups else torch.device("cpu")

    def _scatter(self, entries, keys, tensors, root, chunk):
        """Send each rank its slices of the per-element state, in rounds; ``{(group, key): this rank's slice}``."""
        pieces = []  # (group, key, rank, lo, hi, dtype): elements [lo, hi) of the group's flat state
        for gi, (g, group) in enumerate(zip(self._groups, entries, strict=True)):
            if group is None:
                continue
            for k in keys[gi]:
                dtype = group[0][k].dtype
                for r, (a, b) in enumerate(partition(g.offsets[-1], self._size)):
                    if r != root:  # the root keeps the slices it loaded
                        pieces.extend((gi, k, r, lo, min(lo + chunk, b), dtype) for lo in range(a, b, chunk))
        # each round: pieces of one dtype, <= chunk elements, sent in rank order
        packed = pack_rounds([p[4] - p[3] for p in pieces], chunk, [p[5] for p in pieces])
        rounds = [(pieces[round_[0]][5], [pieces[j] for j in round_]) for round_ in packed]
        mine = {}
        for gi, g in enumerate(self._groups):
            for k in keys[gi] if entries[gi] is not None else []:
                start, stop = g.slice
                mine[gi, k] = torch.empty(stop - start, dtype=entries[gi][0][k].dtype, device=self._device())
        received = 0
        for i, (dtype, round_) in enumerate(rounds):
            round_.sort(key=lambda piece: piece[2])  # stable: the same order on every rank
            splits = torch.zeros(self._size, dtype=torch.int32)
            if self._rank == root:
                parts = []
                for gi, k, r, lo, hi, _ in round_:
                    parts.append(self._flat_range(gi, [tensors[e[k].index] for e in entries[gi]], lo, hi))
                    splits[r] += hi - lo
                send = torch.cat(parts).to(self._device())
            else:
                send = torch.empty(0, dtype=dtype, device=self._device())
            out, _ = self._hvd.alltoall(send, splits=splits, name=f"hvdkit.zero.scatter.{i}")
            received = max(received, out.numel())
            at = 0
            for gi, k, r, lo, hi, _ in round_:
                if r == self._rank:
                    start = self._groups[gi].slice.start
                    mine[gi, k][lo - start : hi - start].copy_(out[at : at + hi - lo])
                    at += hi - lo
            del out
        self.last_scatter = {"root": root, "rounds": len(rounds), "largest_round": received}
        return mine

    def _flat_range(self, gi, tensors, lo, hi):
        """Elements ``[lo, hi)`` of the flat vector of group ``gi``'s ``tensors`` (one per trainable parameter)."""
        g = self._groups[gi]
        return torch.cat([tensors[i].reshape(-1)[a:b] for i, a, b in spans(g.offsets, lo, hi)])


def _is_slice(value):
    return isinstance(value, torch.Tensor) and value.dim() == 1


def elements(state: dict[Any, dict[str, Any]]) -> int:
    """How many elements the tensors of an optimizer ``state`` hold (for measuring the sharding)."""
    return sum(v.numel() for s in state.values() for v in s.values() if isinstance(v, torch.Tensor))

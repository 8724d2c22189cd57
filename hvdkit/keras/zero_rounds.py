"""ZeRO-1 for Keras (``hvdkit.keras.zero``): the slices moved between the model's variables and the shards in rounds.

Keras variables own their storage, so they cannot be views of one flat buffer as the torch
parameters are (``hvdkit.torch.zero_flat``). What a step can still avoid is the whole flat
vector. The reduce-scatter packs every rank's part of a round straight from the variables'
gradients (rounds of at most ``round_elements`` elements over all ranks,
``hvdkit.core.zero.plan_rounds``); this rank's reduced parts are joined into its slice's gradient,
which the Keras optimizer's ``apply`` takes as one tensor. The all-gather brings whole variables,
a round of them at a time (at most ``round_elements`` elements, or one larger variable alone):
each rank sends its part of each variable and receives the variable whole, which is assigned.

Why whole variables: any partial write of a TensorFlow resource variable (a strided-slice or
scatter assignment) switches it to copy-on-read for good, after which every dense read of it,
the forward pass's included, copies the whole variable (measured: 50 reads of a 32 MiB variable
6 ms before one slice assignment, 1.25 s after, and still after a full ``assign``). So the
variables and the shards are only ever written whole. In a ``tf.function`` each round waits for
the previous one (control dependencies), so the graph keeps the same bound.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import tensorflow as tf

from ..core.options import check_positive_int
from ..core.zero import ROUND_ELEMENTS, pack_rounds, plan_rounds, rank_parts

# ROUND_ELEMENTS and rank_parts are hvdkit.core.zero's, named here too for the code that imports them from here.
__all__ = ["ROUND_ELEMENTS", "gather", "rank_parts", "refresh", "scatter", "variable_rounds"]


def _read(group, tensors, start, stop):
    """The elements ``[start, stop)`` of the group's flat vector of ``tensors`` (None: zeros), as 1-D pieces."""
    parts = []
    for i, lo, hi in group.spans(start, stop):
        t = tensors[i]
        if t is None:
            parts.append(tf.zeros([hi - lo], group.dtype))
        else:
            parts.append(tf.cast(tf.reshape(t, [-1])[lo:hi], group.dtype))
    return parts


def _concat(parts, dtype):
    return tf.concat(parts, 0) if parts else tf.zeros([0], dtype)


def _copy(parts, dtype):
    """``parts`` joined into a tensor of its own memory. TensorFlow's concat of one part (and a slice) can
    share the part's memory; a variable assigned such a tensor may then keep the whole of another
    variable's buffer alive, and an in-place update of one may write into the other."""
    return tf.raw_ops.DeepCopy(x=parts[0]) if len(parts) == 1 else _concat(parts, dtype)


def _plan(zero, limit):
    check_positive_int("round_elements", limit, "set it on the optimizer (e.g. 1 << 22)")
    return plan_rounds([g.length for g in zero.groups], zero.size, limit)


@tf.autograph.experimental.do_not_convert
def scatter(zero: Any, ordered: Sequence[Any], hvd: Any, fp16: bool, limit: int) -> tuple[list[Any], dict[str, int]]:
    """Each group's slice of the gradients ``ordered`` (one per variable, None: zeros), averaged over the ranks.

    Each round packs every rank's part of its pieces from the gradients and reduce-scatters it; this
    rank's reduced parts are joined into its slice's gradient at the end (one tensor per group).
    Returns ``(gradients, {"rounds": n, "largest_round": elements})``.
    Collective: every rank calls it alike (size 1: no collective).
    """
    rounds = _plan(zero, limit)
    got = [[] for _ in zero.groups]
    previous, largest = [], 0
    for n, round_ in enumerate(rounds):
        with tf.control_dependencies(previous):
            packs = []
            for j, piece in enumerate(round_):
                group = zero.groups[piece.group]
                tensors = [ordered[zero.index[id(v)]] for v in group.variables]
                parts = [p for a, b in rank_parts(group.bounds, piece) for p in _read(group, tensors, a, b)]
                pack = _concat(parts, group.dtype)
                pack = tf.cast(pack, tf.float16) if fp16 and zero.size > 1 else pack
                # In a tf.function the engine names the collective after its first input: a name of our
                # own, the same on every rank (the ops before it differ by rank, and so would theirs).
                packs.append(tf.identity(pack, name=f"hvdkit_zero_grads_{n}_{j}"))
                largest = max(largest, sum(b - a for a, b in rank_parts(group.bounds, piece)))
            outs = hvd.grouped_reducescatter(packs, op=hvd.Average) if zero.size > 1 else packs
            del packs
        previous = [tf.cast(o, zero.groups[p.group].dtype) for p, o in zip(round_, outs, strict=True)]
        del outs
        for piece, out in zip(round_, previous, strict=True):
            got[piece.group].append(out)
    grads = [_concat(parts, g.dtype) for parts, g in zip(got, zero.groups, strict=True)]
    return grads, {"rounds": len(rounds), "largest_round": largest}


@tf.autograph.experimental.do_not_convert
def refresh(zero: Any) -> None:
    """Copy this rank's slice of the variables into its shards, whole (no collective; a slice-sized temporary).

    The variables may have been set since the last step (a restore, a broadcast, ``set_weights``).
    """
    for group in zero.groups:
        start, stop = group.slice
        group.shard.assign(_copy(_read(group, [v.value for v in group.variables], start, stop), group.dtype))


def variable_rounds(sizes: list[int], limit: int) -> list[list[int]]:
    """The indices of ``sizes`` (elements of each variable, in order) packed into rounds of consecutive variables.

    A round holds at most ``limit`` elements, or a single variable larger than that; every index
    appears once, in order. The same on every rank.
    """
    check_positive_int("round_elements", limit, "set it on the optimizer (e.g. 1 << 22)")
    return pack_rounds(sizes, limit)


@tf.autograph.experimental.do_not_convert
def gather(zero: Any, hvd: Any, name: str, limit: int) -> None:
    """Every rank's updated shard into every rank's variables: whole variables, a round of them at a time.

    Each rank sends its part of each variable of the round (maybe none of it); the engine's
    all-gather joins the parts in rank order, which is the variable's flat value, assigned whole.
    Collective: every rank calls it alike (size 1: no collective).
    """
    entries = [(g, i) for g in zero.groups for i in range(len(g.variables))]
    rounds = variable_rounds([g.sizes[i] for g, i in entries], limit)
    previous = []
    for n, round_ in enumerate(rounds):
        with tf.control_dependencies(previous):
            sends = []
            for k in round_:
                group, i = entries[k]
                start, stop = group.slice
                lo = min(max(group.offsets[i], start), stop) - start
                hi = max(min(group.offsets[i + 1], stop), start) - start
                sends.append(group.shard.value[lo:hi])
            if zero.size > 1:
                outs = hvd.grouped_allgather(sends, name=f"{name}.zero.{n}")
            else:
                outs = [_copy([s], s.dtype) for s in sends]
            del sends
        previous = list(outs)
        for k, out in zip(round_, outs, strict=True):
            group, i = entries[k]
            variable = group.variables[i]
            variable.assign(tf.reshape(out, variable.shape))
        del outs

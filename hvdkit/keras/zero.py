"""Optimizer-state sharding (ZeRO stage 1) for Keras 3 on Horovod's TensorFlow reduce-scatter and all-gather.

The trainable variables of each dtype are seen as one flat vector; rank ``r`` owns the slice
``partition(length, size)[r]`` of it (``hvdkit.core.zero``: balanced, contiguous, the way the
engine's ``reducescatter`` cuts it). The optimizer is built over one 1-D "shard" variable per
dtype holding this rank's slice, so its slot variables (momentums, velocities, ...) hold about
``1/size`` of the unsharded state. ``apply`` reduce-scatters the gradients, lets the Keras
optimizer update the shards and all-gathers them back into the model's variables, both in rounds
of at most ``round_elements`` elements (``hvdkit.keras.zero_rounds``): straight from the
gradients, and whole variables a round at a time. Besides the shards and their slot variables a
step holds no copy of the whole flat vector: this rank's slice of the averaged gradient, one round,
and at most one variable larger than a round. Only optimizers whose update is elementwise can be
cut this way (``ELEMENTWISE_OPTIMIZERS``). With gradient accumulation Keras sums this rank's slices of
the averaged gradients in accumulators of the slice's size, and updates the shards at a step's last
batch (the all-gather still runs after every batch; the weights change at the last only).

``resize()`` cuts the slices anew for the ranks of the job now (``hk.elastic`` after a lost worker or
a join): the shards and the Keras optimizer's per-slice variables are made again, empty; the state
then comes from the unsharded state (``load_unsharded``), the same at any world size.

No overlap with the backward pass, unlike the torch form (``hvdkit.torch.zero_overlap``): Keras
hands the optimizer every gradient at once (``apply`` after ``GradientTape.gradient``, which has
no per-variable hook), so the reduce-scatter starts when backward is over, as Horovod's own
TensorFlow optimizer's allreduce does.

``hvdkit.keras.DistributedOptimizer(..., shard_optimizer_state=True)`` makes such an optimizer;
``hvdkit.tensorflow.Checkpointer`` saves its state consolidated (the unsharded optimizer's
variables, the same at any world size) and restores it into a sharded or an unsharded optimizer.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import keras
import numpy as np
import tensorflow as tf

from ..core.errors import ConfigError
from ..core.options import AUTO
from ..core.zero import ROUND_ELEMENTS, partition, spans
from ..tensorflow import autocompress
from ..tensorflow._engine import horovod_tf
from . import zero_rounds
from .loss_scale import ShardedLossScaleMixin

__all__ = ["ELEMENTWISE_OPTIMIZERS", "check_shardable", "is_sharded", "state_elements"]

# Keras optimizers whose update of an element reads only that element's variable, gradient and slot
# values (plus scalars: iterations, learning rate, Nadam's u_product), so a slice updated alone equals
# the same slice of the whole. Not: Lamb (per-variable trust ratio), Adafactor (row/column factors),
# Muon (matrix orthogonalisation), ScheduleFreeAdamW. A LossScaleOptimizer is unwrapped by DistributedOptimizer
# (its inner optimizer is sharded, the loss scaling goes around it: hvdkit.keras.loss_scale).
ELEMENTWISE_OPTIMIZERS = (
    keras.optimizers.SGD,
    keras.optimizers.Adam,
    keras.optimizers.AdamW,
    keras.optimizers.Adamax,
    keras.optimizers.Nadam,
    keras.optimizers.RMSprop,
    keras.optimizers.Adagrad,
    keras.optimizers.Adadelta,
    keras.optimizers.Lion,
    keras.optimizers.Ftrl,
)

_FIX = "pass shard_optimizer_state=False to keep the whole state on every rank"
_ACCUMULATOR = "gradient_accumulator"  # the name Keras gives its accumulators (add_variable_from_reference)


def check_shardable(optimizer: keras.optimizers.Optimizer) -> None:
    """Raise ConfigError unless ``optimizer`` (a plain Keras optimizer) can have its state sharded.

    Its class must be one of ``ELEMENTWISE_OPTIMIZERS`` (exactly: a subclass may change the update),
    and it must not use what acts per variable or on the whole variables: ``clipnorm`` (use
    ``global_clipnorm``, computed from the shards as the unsharded one) or ``use_ema``. Gradient
    accumulation (``gradient_accumulation_steps``) is allowed: Keras accumulates this rank's slice of
    the averaged gradient (its accumulators are slices too). No collective: every rank raises alike.
    """
    if type(optimizer) not in ELEMENTWISE_OPTIMIZERS:
        allowed = ", ".join(c.__name__ for c in ELEMENTWISE_OPTIMIZERS)
        raise ConfigError(
            f"shard_optimizer_state=True cannot shard {type(optimizer).__name__}: only optimizers whose update "
            f"is elementwise can update a slice of the variables alone ({allowed}); {_FIX}"
        )
    _check_options(optimizer)


def _check_options(optimizer):
    if optimizer.clipnorm:
        raise ConfigError(
            f"shard_optimizer_state=True cannot clip each variable to its own norm (clipnorm={optimizer.clipnorm}): "
            "a rank holds slices of variables; use global_clipnorm (the norm of all gradients, computed from "
            f"the shards) or {_FIX}"
        )
    if optimizer.use_ema:
        raise ConfigError(
            f"shard_optimizer_state=True does not support use_ema=True (a moving average of whole variables); {_FIX}"
        )


def _check_variables(optimizer, variables):
    """Refuse what a flat slice cannot honour, before any collective (``build``)."""
    if getattr(optimizer, "_exclude_from_weight_decay", None) or getattr(
        optimizer, "_exclude_from_weight_decay_pattern", None
    ):
        raise ConfigError(
            "shard_optimizer_state=True cannot exclude variables from weight decay (exclude_from_weight_decay): "
            f"a rank's slice mixes variables; drop the exclusion or {_FIX}"
        )
    special = [v.path for v in variables if getattr(v, "overwrite_with_gradient", False)]
    if special:
        raise ConfigError(
            f"shard_optimizer_state=True cannot shard variables set from their gradient ({special[:3]}); {_FIX}"
        )
    _check_options(optimizer)


class _Group:
    """The trainable variables of one dtype: their offsets in the flat vector, this rank's slice, its shard."""

    def __init__(self, index, variables, dtype, rank, size):
        self.variables = variables
        self.dtype = dtype
        self.sizes = [int(np.prod(v.shape)) for v in variables]
        self.offsets = [0]
        for n in self.sizes:
            self.offsets.append(self.offsets[-1] + n)
        self.bounds = partition(self.offsets[-1], size)
        self.slice = self.bounds[rank]
        self.shard = keras.Variable(
            np.zeros(self.slice.stop - self.slice.start, dtype=dtype),
            dtype=dtype,
            trainable=False,
            name=f"hvdkit_zero_shard_{index}",
        )

    @property
    def length(self):
        """Elements of the group's flat vector."""
        return self.offsets[-1]

    def spans(self, start, stop):
        """``(index, lo, hi)`` for each variable that overlaps the flat elements ``[start, stop)``: its ``[lo, hi)``."""
        return spans(self.offsets, start, stop)


def _dense(t):
    return tf.convert_to_tensor(t) if isinstance(t, tf.IndexedSlices) else t


class _Shards:
    """What a sharded optimizer keeps besides Keras's own state (a plain object: Keras does not track it)."""

    def __init__(self, variables, rank, size):
        self.rank, self.size = rank, size
        self.variables = list(variables)
        self.index = {id(v): i for i, v in enumerate(self.variables)}
        dtypes = list(dict.fromkeys(str(v.dtype) for v in self.variables))
        self.groups = []
        self.where = {}  # id(variable) -> (group, index in the group)
        for gi, dtype in enumerate(dtypes):
            members = [v for v in self.variables if str(v.dtype) == dtype]
            group = _Group(gi, members, dtype, rank, size)
            for j, v in enumerate(members):
                self.where[id(v)] = (group, j)
            self.groups.append(group)
        self.slots = {}  # id(slot variable) -> (group index, slot name)
        self.recording = False
        self.last_rounds = None  # the last step's reduce-scatter: rounds and the largest one's elements
        self.layout = None  # the unsharded optimizer's variables: ("own", k) or ("slot", variable index, name)
        self.first_built = 0  # how many variables the Keras optimizer had before it was built over the shards


def is_sharded(optimizer: object) -> bool:
    """True when ``optimizer`` came from ``DistributedOptimizer(..., shard_optimizer_state=True)``.

    Under ``mixed_float16`` that is the loss-scale optimizer around the sharded one: it offers the same
    sharded-state calls (``broadcastable_variables``, ``consolidate``, ...). Both satisfy
    ``hvdkit.core.zero.ShardedState``.
    """
    return isinstance(optimizer, (ShardedMixin, ShardedLossScaleMixin))


def state_elements(optimizer: keras.optimizers.Optimizer) -> int:
    """How many elements the optimizer's variables hold (for measuring the sharding); shards themselves excluded."""
    return sum(int(np.prod(v.shape)) for v in optimizer.variables)


class ShardedMixin:
    """Mixed in before ``_AveragingMixin`` and the user's optimizer class by ``DistributedOptimizer``.

    ``build(variables)`` builds the Keras optimizer over this rank's shards; ``apply`` reduce-scatters,
    updates the shards (Keras's own clipping, weight decay, loss-scale unscaling) and all-gathers
    them into the variables, whose constraints it then applies. A gradient that is None counts as 0
    (an ``IndexedSlices`` gradient is made dense first). ``round_elements`` (default 2**22) bounds
    what one round of either collective moves over all ranks (the all-gather moves a larger
    variable alone); set it on the optimizer, the same on every rank. ``last_rounds`` reports the
    last reduce-scatter's rounds.
    """

    _hvdkit_zero = None
    _hvdkit_base = None  # the user's optimizer class (set on the class DistributedOptimizer makes)
    round_elements = ROUND_ELEMENTS

    @property
    def last_rounds(self) -> dict[str, int] | None:
        """The last step's reduce-scatter: ``{"rounds": n, "largest_round": elements over all ranks}`` (None before)."""
        zero = self._hvdkit_zero
        return None if zero is None or zero.last_rounds is None else dict(zero.last_rounds)

    # ------------------------------------------------------------ build
    def build(self, variables):
        if self.built:
            return
        self._hvdkit_check_unwrapped()  # hvdkit.keras.loss_scale: before Horovod is asked anything
        variables = list(variables)
        _check_variables(self, variables)  # before Horovod is asked anything too
        hvd = horovod_tf()
        self._hvdkit_build(variables, hvd.rank(), hvd.size())

    def _hvdkit_build(self, variables, rank, size):
        """Build the Keras optimizer over the shards of ``rank`` of ``size``: ``variables`` as ``build`` checked them
        (``resize`` passes the same again). No collective."""
        zero = _Shards(variables, rank, size)
        zero.first_built = len(self.variables)
        self._hvdkit_zero = zero
        zero.recording = True
        try:
            super().build([g.shard for g in zero.groups])
        finally:
            zero.recording = False

    def resize(self) -> None:
        """Cut the slices anew for this rank of the job now (``hk.elastic``, after a lost worker or a join).

        The shards and every variable the Keras optimizer made over them (slots, accumulators, and
        those of its own it makes at build, as Nadam's) are made again: the slot state is empty
        (zeros) until ``load_unsharded`` gives this rank its slices of the unsharded state; the
        variables made before the build (step count, learning rate) keep their values. An optimizer
        not built yet is left as it is (its build cuts the slices of the job then). No collective.
        """
        if self.built:
            hvd = horovod_tf()
            self._hvdkit_reshard(hvd.rank(), hvd.size())

    def _hvdkit_reshard(self, rank, size):
        """``resize`` for ``rank`` of ``size`` (tests give any; no collective)."""
        zero = self._hvdkit_zero
        for v in self.variables[zero.first_built :]:
            self._untrack_variable(v)
        self._trainable_variables_indices = {}
        self._trainable_variables = []
        self.built = False
        self._hvdkit_build(zero.variables, rank, size)
        self.built = True

    def add_variable_from_reference(self, reference_variable, name=None, initializer="zeros"):
        variable = super().add_variable_from_reference(reference_variable, name=name, initializer=initializer)
        zero = self._hvdkit_zero
        if zero is not None and zero.recording:
            gi = next(i for i, g in enumerate(zero.groups) if g.shard is reference_variable)
            zero.slots[id(variable)] = (gi, name or "var")
        return variable

    # ------------------------------------------------------------ apply
    def apply(self, grads, trainable_variables=None):
        self._hvdkit_check_unwrapped()
        grads = list(grads)
        if not grads:
            return None
        if not self.built:
            if trainable_variables is None:
                raise ValueError("a sharded optimizer needs trainable_variables at its first apply (or build it first)")
            self.build(list(trainable_variables))
        zero = self._hvdkit_zero
        variables = zero.variables if trainable_variables is None else list(trainable_variables)
        if len(variables) != len(grads):
            raise ValueError(f"got {len(grads)} gradients for {len(variables)} variables")
        ordered = [None] * len(zero.variables)
        for g, v in zip(grads, variables, strict=True):
            i = zero.index.get(id(v))
            if i is None:
                raise ValueError(
                    f"variable {getattr(v, 'path', v.name)} is not one the sharded optimizer was built with; "
                    "build it with all the variables it will update (model.trainable_variables)"
                )
            ordered[i] = g
        ordered = [None if g is None else _dense(g) for g in ordered]
        if self._hvdkit_compression == AUTO:  # decided once, at the first apply (while tracing: eagerly)
            self._hvdkit_compression = autocompress.resolve(AUTO, [g for g in ordered if g is not None])
        # the variables may have been set since the last apply (a restore, a broadcast): the shards follow
        # them; first, so that its slice-sized temporary is gone before the reduce-scatter's
        zero_rounds.refresh(zero)
        clock = self._hvdkit_wait
        shard_grads = self._hvdkit_scatter(ordered) if clock is None else clock.time(self._hvdkit_scatter, ordered)
        del ordered
        self._hvdkit_base.apply(self, shard_grads, [g.shard for g in zero.groups])
        del shard_grads  # freed before the all-gather's rounds
        self._hvdkit_gather()
        for v in zero.variables:
            if v.constraint is not None:
                v.assign(v.constraint(v))
        return None

    @tf.autograph.experimental.do_not_convert
    def _hvdkit_scatter(self, ordered):
        """Each group's slice of the gradients averaged over the ranks, reduce-scattered in rounds."""
        fp16 = self._hvdkit_compression == "fp16"
        zero = self._hvdkit_zero
        grads, zero.last_rounds = zero_rounds.scatter(zero, ordered, horovod_tf(), fp16, self.round_elements)
        return grads

    @tf.autograph.experimental.do_not_convert
    def _hvdkit_gather(self):
        zero_rounds.gather(self._hvdkit_zero, horovod_tf(), self._hvdkit_name, self.round_elements)

    def _clip_gradients(self, grads):
        # global_clipnorm: the norm of the whole gradient, from every rank's slices (one allreduce of the
        # sum of squares), applied as Keras's clip_by_global_norm does; clipvalue is elementwise anyway.
        if self.global_clipnorm and self.global_clipnorm > 0 and not self.clipnorm:
            zero = self._hvdkit_zero
            local = tf.add_n([tf.reduce_sum(tf.square(tf.cast(g, tf.float32))) for g in grads])
            if zero.size > 1:
                hvd = horovod_tf()
                local = hvd.allreduce(local, op=hvd.Sum, name=f"{self._hvdkit_name}.zero.norm")
            norm = tf.sqrt(local)
            clip = tf.constant(self.global_clipnorm, tf.float32)
            scale = clip * tf.minimum(1.0 / norm, 1.0 / clip) + (norm - norm)
            return [g * tf.cast(scale, g.dtype) for g in grads]
        return super()._clip_gradients(grads)

    # ------------------------------------------------------------ state, unsharded
    def _hvdkit_layout(self):
        """The unsharded optimizer's variables, in its order: ``("own", k)`` (k-th non-slot) or ``("slot", i, name)``.

        Gradient accumulators are left out: they are zero between steps, and an unsharded optimizer's
        checkpoint leaves them out too, so the state is the same at any accumulation.

        Found by building a throwaway optimizer of the same class over one 1-element stand-in per variable.
        """
        zero = self._hvdkit_zero
        if zero.layout is None:
            base = self._hvdkit_base
            made = {}

            class _Probe(base):
                def add_variable_from_reference(probe, reference_variable, name=None, initializer="zeros"):  # noqa: N805
                    variable = super().add_variable_from_reference(
                        reference_variable, name=name, initializer=initializer
                    )
                    made[id(variable)] = (stand_ins[id(reference_variable)], name or "var")
                    return variable

            stand_ins = {}
            dummies = []
            for i, v in enumerate(zero.variables):
                d = keras.Variable(np.zeros(1, dtype=str(v.dtype)), trainable=False, name=f"hvdkit_zero_probe_{i}")
                stand_ins[id(d)] = i
                dummies.append(d)
            probe = _Probe.from_config(self.get_config())
            probe.build(dummies)
            layout, k = [], 0
            for v in probe.variables:
                if id(v) in made:
                    if made[id(v)][1] != _ACCUMULATOR:  # zero between steps: not state (as unsharded checkpoints)
                        layout.append(("slot", *made[id(v)]))
                else:
                    layout.append(("own", k))
                    k += 1
            own = self._hvdkit_own_variables()
            if k != len(own):
                raise ConfigError(
                    f"the unsharded {base.__name__} has {k} variables besides its slots, the sharded one {len(own)}"
                )
            zero.layout = layout
        return zero.layout

    def _hvdkit_own_variables(self):
        """The optimizer's variables that are not slots (iteration, learning rate, ...): the same on every rank."""
        zero = self._hvdkit_zero
        return [v for v in self.variables if id(v) not in zero.slots]

    def _hvdkit_slot(self, group_index, name):
        zero = self._hvdkit_zero
        for v in self.variables:
            if zero.slots.get(id(v)) == (group_index, name):
                return v
        raise ConfigError(f"no slot {name!r} for shard {group_index}")

    def broadcastable_variables(self) -> list[Any]:
        """The optimizer's variables that are the same on every rank (not the slots): what a broadcast may send."""
        return self._hvdkit_own_variables()

    def unsharded_specs(self) -> list[tuple[tuple[int, ...], str]]:
        """``(shape, dtype)`` of each variable of the unsharded optimizer, in its order (no collective)."""
        zero = self._hvdkit_zero
        own = self._hvdkit_own_variables()
        specs = []
        for entry in self._hvdkit_layout():
            v = own[entry[1]] if entry[0] == "own" else zero.variables[entry[1]]
            specs.append((tuple(v.shape), str(v.dtype)))
        return specs

    def consolidated_variables(self, to: int | None = 0) -> list[np.ndarray] | None:
        """The old name of ``consolidate`` (the name of ``hvdkit.core.zero.ShardedState``); the same call."""
        return self.consolidate(to)

    def consolidate(self, to: int | None = 0) -> list[np.ndarray] | None:
        """The unsharded optimizer's variables as arrays on rank ``to`` (None: every rank); None on the others.

        Each slot is all-gathered once (every rank holds one slot of one dtype whole while it goes by).
        The result is what ``keras`` would hold unsharded, the same at any world size.
        Collective: every rank calls it alike.
        """
        zero = self._hvdkit_zero
        if to is not None and (isinstance(to, bool) or not isinstance(to, int) or not 0 <= to < zero.size):
            raise ConfigError(f"to must be a rank in [0, {zero.size}) or None (got {to!r})")
        keep = to is None or to == zero.rank
        layout = self._hvdkit_layout()
        own = self._hvdkit_own_variables()
        wholes = {}
        keys = list(dict.fromkeys((zero.where[id(zero.variables[e[1]])][0], e[2]) for e in layout if e[0] == "slot"))
        for n, (group, name) in enumerate(keys):
            slot = self._hvdkit_slot(zero.groups.index(group), name)
            if zero.size == 1:
                whole = slot.numpy()
            else:
                whole = horovod_tf().allgather(slot.value, name=f"{self._hvdkit_name}.zero.state.{n}").numpy()
            if keep:
                wholes[id(group), name] = whole
            del whole
        if not keep:
            return None
        out = []
        for entry in layout:
            if entry[0] == "own":
                out.append(np.array(own[entry[1]].numpy()))
                continue
            v = zero.variables[entry[1]]
            group, j = zero.where[id(v)]
            flat = wholes[id(group), entry[2]]
            out.append(flat[group.offsets[j] : group.offsets[j + 1]].reshape(tuple(v.shape)).copy())
        return out

    def load_unsharded(self, values: Iterable[Any]) -> None:
        """Set the state from the unsharded optimizer's variables (``unsharded_specs`` order): this rank's slices.

        ``values`` may be a generator: one whole variable is held at a time. Gradient accumulators (not
        part of it) are set to zero: the state is one between steps. No collective.
        """
        zero = self._hvdkit_zero
        layout = self._hvdkit_layout()
        own = self._hvdkit_own_variables()
        buffers = {}
        count = 0
        for entry, value in zip(layout, values, strict=False):
            count += 1
            value = np.asarray(value)
            if entry[0] == "own":
                own[entry[1]].assign(value)
                continue
            v = zero.variables[entry[1]]
            group, j = zero.where[id(v)]
            key = (zero.groups.index(group), entry[2])
            if key not in buffers:
                buffers[key] = np.array(self._hvdkit_slot(*key).numpy())
            buf = buffers[key]
            lo = max(group.slice.start - group.offsets[j], 0)
            hi = min(group.slice.stop - group.offsets[j], group.sizes[j])
            if lo < hi:
                at = group.offsets[j] + lo - group.slice.start
                buf[at : at + hi - lo] = value.reshape(-1)[lo:hi]
        if count != len(layout):
            raise ConfigError(f"the unsharded state has {len(layout)} variables, got {count}")
        for key, buf in buffers.items():
            self._hvdkit_slot(*key).assign(buf)
        for v in self.variables:
            if zero.slots.get(id(v), (None, None))[1] == _ACCUMULATOR:
                v.assign(tf.zeros_like(v))

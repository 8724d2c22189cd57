"""The flat buffers of ZeRO-1 (``hvdkit.torch.zero``): one per param group for the parameters, one for their gradients.

Each param group's trainable parameters become views of one contiguous buffer (``p.data`` is
rebound; the ``Parameter`` objects the user holds stay the same), and their gradients views of a
second one, as DeepSpeed's and FSDP's flat parameters do. This rank's slice of the parameters (the
inner optimizer's parameter) is a view of the first buffer and its gradient a view of the second:
the reduce-scatter writes the averaged slice into the gradient buffer in place, the inner optimizer
updates the parameter slice in place, and the all-gather writes the other ranks' slices into the
parameter buffer. No whole-size copy of the parameters or gradients exists; what moves in one
round of a collective is bounded by ``round_elements`` (``hvdkit.core.zero.plan_rounds``).

Gradients: ``p.grad`` is the view while set. ``zero_grad(set_to_none=True)`` (torch's default)
still leaves ``p.grad is None`` as usual; a hook attaches the (zeroed) view again when the next
gradient arrives, so the gradient accumulates into the buffer instead of a fresh tensor. A
parameter whose gradient is ``None`` at ``step()`` counts zero. After ``step()`` the gradients
in this rank's slice hold the averaged (clipped) gradient, the rest the local one; call
``zero_grad()`` before the next backward, as with any optimizer.

Layout: a parameter that is not contiguous (``channels_last``) becomes a contiguous view (same
values; torch's ops accept either). A group must hold one dtype and one device
(``check_shardable``). A parameter given new storage after construction (``p.data = t``, a
``load_state_dict(assign=True)``) is copied back into its place at the next ``step()``; one moved to
another dtype or device (``model.to(...)`` after building the optimizer) is refused there with the fix.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterable, Iterator, Sequence

import torch

from ..core.errors import ConfigError
from ..core.zero import partition, spans

__all__ = ["FlatGroup"]


class FlatGroup:
    """One param group as the shard sees it: its trainable parameters as views of flat buffers, this rank's slice.

    ``params``: the trainable parameters; ``offsets``: where each starts in the flat vector;
    ``slice``: this rank's elements; ``flat``/``grads``: the parameter and gradient buffers;
    ``shard``: ``flat[slice]`` (its ``.grad`` is ``grads[slice]``).
    """

    def __init__(self, params: Iterable[torch.Tensor], rank: int, size: int, index: int) -> None:
        self.index = index
        self.params = [p for p in params if p.requires_grad]
        self.offsets = [0]
        for p in self.params:
            self.offsets.append(self.offsets[-1] + p.numel())
        self.bounds = partition(self.offsets[-1], size)
        self.slice = self.bounds[rank]
        like = self.params[0] if self.params else torch.zeros(0)
        self.dtype, self.device = like.dtype, like.device
        n = self.offsets[-1]
        # Filled one parameter at a time, each old tensor dropped at once: the transient is one parameter.
        self.flat = torch.empty(n, dtype=self.dtype, device=self.device)
        self.grads = torch.zeros(n, dtype=self.dtype, device=self.device)
        for i, p in enumerate(self.params):
            self._rebind(i, p)
            self._adopt_grad(i, p)
            p.register_hook(_AttachGrad(self, i))
        self.shard = self.flat[self.slice.start : self.slice.stop]
        self.shard.grad = self.grads[self.slice.start : self.slice.stop]

    def view(self, buffer: torch.Tensor, i: int) -> torch.Tensor:
        """Parameter ``i``'s part of ``buffer`` (``flat`` or ``grads``), shaped like it."""
        return buffer[self.offsets[i] : self.offsets[i + 1]].view(self.params[i].shape)

    def holds(self, i: int, tensor: torch.Tensor, buffer: torch.Tensor) -> bool:
        """True when ``tensor`` is parameter ``i``'s view of ``buffer`` (the same memory and shape)."""
        return (
            tensor.device == buffer.device
            and tensor.dtype == buffer.dtype
            and tensor.shape == self.params[i].shape
            and tensor.is_contiguous()
            and (tensor.numel() == 0 or tensor.data_ptr() == buffer[self.offsets[i] :].data_ptr())
        )

    def pieces(self) -> Iterator[tuple[int, int, int]]:
        """``(index, lo, hi)`` for each parameter that overlaps this rank's slice: its elements ``[lo, hi)``."""
        return spans(self.offsets, *self.slice)

    def own(self, tensors: Sequence[torch.Tensor]) -> torch.Tensor:
        """This rank's slice of the flat vector of ``tensors`` (one per trainable parameter), copied."""
        parts = [tensors[i].reshape(-1)[lo:hi] for i, lo, hi in self.pieces()]
        return torch.cat(parts) if parts else self.flat.new_zeros(0)

    def unflatten(self, flat: torch.Tensor) -> list[torch.Tensor]:
        """``flat`` (the whole group's vector) cut back into tensors of the parameters' shapes (views)."""
        return [flat[a:b].view_as(p) for p, a, b in zip(self.params, self.offsets, self.offsets[1:], strict=False)]

    def _rebind(self, i, p):
        with torch.no_grad():
            self.view(self.flat, i).copy_(p.detach())
        p.data = self.view(self.flat, i)

    def _adopt_grad(self, i, p):
        if p.grad is not None:
            with torch.no_grad():
                self.view(self.grads, i).copy_(p.grad)
            p.grad = self.view(self.grads, i)

    def prepare(self) -> None:
        """Before a step: every parameter a view of ``flat`` again, every gradient in ``grads`` (None: zeros).

        Raises ConfigError naming the parameter where one was moved to another dtype or device.
        """
        for i, p in enumerate(self.params):
            if p.dtype != self.dtype or p.device != self.device:
                raise ConfigError(
                    f"parameter {i} of param group {self.index} is now {p.dtype} on {p.device}, but the sharded "
                    f"optimizer keeps it as {self.dtype} on {self.device}: build hk.DistributedOptimizer(..., "
                    "shard_optimizer_state=True) after model.to(...)"
                )
            if not self.holds(i, p.data, self.flat):
                self._rebind(i, p)
            if p.grad is None:
                self.view(self.grads, i).zero_()
            elif not self.holds(i, p.grad, self.grads):
                self._adopt_grad(i, p)


class _AttachGrad:
    """A gradient hook: where ``p.grad`` is None when a gradient arrives, make the zeroed view of the group's
    gradient buffer ``p.grad`` first, so autograd accumulates into the buffer instead of a fresh tensor.

    It holds the group weakly and does nothing once the parameter is no longer a view of that group's
    buffer (another sharded optimizer took it over).
    """

    def __init__(self, group, i):
        self.group = weakref.ref(group)
        self.i = i

    def __call__(self, grad):
        group = self.group()
        if group is None:
            return grad
        p = group.params[self.i]
        if p.grad is None and group.holds(self.i, p.data, group.flat):
            view = group.view(group.grads, self.i)
            view.zero_()
            p.grad = view
        return grad

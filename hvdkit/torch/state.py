"""Making every rank start from rank 0's state."""

from ._engine import horovod_torch

__all__ = ["broadcast_state"]


def broadcast_state(model=None, optimizer=None, extra=None, root_rank=0):
    """Copy ``root_rank``'s model parameters and buffers, optimizer state and ``extra`` to every rank.

    Returns ``root_rank``'s ``extra`` (any picklable object; other ranks may pass anything, of any
    type, e.g. None). Every collective has a name fixed by hvdkit, never derived from a value,
    so ranks that pass objects of different types do not hang (Horovod's ``broadcast_object``
    names the collective after the object's type by default).
    The optimizer state is sent as a whole ``state_dict``; unlike Horovod's
    ``broadcast_optimizer_state`` no fake zero-gradient step is taken on a fresh optimizer, so
    Adam's step count and weight decay are not touched.

    Collective: every rank calls it with the same kind of model and optimizer.
    """
    hvd = horovod_torch()
    if model is not None:
        tensors = {f"hvdkit.state.model.{k}": v for k, v in model.state_dict().items()}
        hvd.broadcast_parameters(tensors, root_rank)
    if optimizer is not None:
        is_root = hvd.rank() == root_rank
        sd = hvd.broadcast_object(
            optimizer.state_dict() if is_root else None, root_rank, name="hvdkit.state.optimizer"
        )
        if not is_root:
            optimizer.load_state_dict(sd)
    return hvd.broadcast_object(extra, root_rank, name="hvdkit.state.extra")

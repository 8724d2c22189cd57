"""A torch Checkpointer whose copies in the write thread can be held (for async-save tests); imports torch."""

import threading

from hvdkit.torch.checkpoint import Checkpointer

BOUND_S = 60  # a gate never opened fails the test here instead of hanging it


class HeldCopy(Checkpointer):
    """A torch Checkpointer whose copies made by the write thread wait until ``gate`` is set (it is, at first);
    ``events`` records each copy made there."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.gate, self.events = threading.Event(), []
        self.gate.set()

    def _copy_into(self, items, old, staging, ready=None):
        if not threading.current_thread().name.startswith("hvdkit-ckpt-write"):
            return super()._copy_into(items, old, staging, ready)
        assert self.gate.wait(BOUND_S), "the test never released the copy"
        out = super()._copy_into(items, old, staging, ready)
        self.events.append("copied " + ",".join(sorted({n.split("/")[0] for n, _ in items})))
        return out

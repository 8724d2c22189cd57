"""Hold rank 0's checkpoint writes at their start, for tests of background (``async_save``) writes.

``hold_writes()`` wraps the arrays writer the checkpointers call (rank 0 only writes) so that a
write waits until the returned event is set: a test clears it before ``save`` and changes the
model while the write is held, proving that what is written is the state at ``save`` time.
"""

import threading

import hvdkit.core.checkpoint.state as checkpoint_state

BOUND_S = 120  # a gate never opened fails the write (and the test) instead of hanging the job


def hold_writes():
    """Install the gate (open); the ``threading.Event`` that lets writes through while set."""
    gate = threading.Event()
    gate.set()
    real = checkpoint_state.write_arrays

    def held(path, items, **how):  # how: direct=...
        if not gate.wait(BOUND_S):
            raise TimeoutError(f"the test never let the write of {path} through")
        return real(path, items, **how)

    checkpoint_state.write_arrays = held
    return gate

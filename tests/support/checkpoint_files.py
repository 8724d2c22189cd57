"""A one-file checkpoint payload for tests of the framework-free checkpoint store."""

import os

STATE = "state.bin"


def writer(payload):
    """A ``write(folder)`` callback that stores ``payload`` (bytes) as the checkpoint's one file."""

    def write(folder):
        with open(os.path.join(folder, STATE), "wb") as f:
            f.write(payload)

    return write


def read(folder):
    """The payload a ``writer`` stored in checkpoint ``folder``."""
    with open(os.path.join(folder, STATE), "rb") as f:
        return f.read()

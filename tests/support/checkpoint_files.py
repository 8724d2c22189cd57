"""A one-file checkpoint payload for tests of the framework-free checkpoint store, and a JSON check
for its ``check=`` callback."""

import os

from hvdkit.core.checkpoint.plain_data import JSON_SCALARS, first_unsupported, unsupported_error

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


def check_json_plain(obj, name):
    """Raise ConfigError unless ``obj`` comes back from JSON equal and of the same types.

    Allowed: None, bool, int, float, str, lists, and dicts with string keys. Tuples (they come back
    as lists), other keys (they come back as strings) and every other type are rejected.
    """
    found = first_unsupported(
        obj, name, lambda v: type(v) in JSON_SCALARS, containers=(dict, list), key_ok=lambda k: type(k) is str
    )
    if found and found[2] == "key":
        raise unsupported_error(found, "the checkpoint manifest (JSON) would give back as a string", "use string keys")
    if found:
        raise unsupported_error(found, "the checkpoint manifest (JSON) cannot give back as it was")

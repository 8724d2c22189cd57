"""What the Horovod elastic test scripts share: the job's output folder and the discovery file.

``OUT/hosts`` is what the test's host discovery script prints (``cat OUT/hosts``); a script changes it
with :func:`set_hosts`, atomically, and leaves a marker file so that every rank (and the test) sees
which event happened.
"""

import os
import sys

OUT = sys.argv[1]


def path(name):
    """``OUT/name``."""
    return os.path.join(OUT, name)


def happened(marker):
    """Whether the event ``marker`` happened (its file exists)."""
    return os.path.exists(path(marker))


def mark(marker):
    """Record that the event ``marker`` happened."""
    open(path(marker), "w").close()


def set_hosts(text, marker):
    """Make host discovery print ``text`` from now on, then mark ``marker``."""
    with open(path("hosts.tmp"), "w") as f:
        f.write(text)
    os.replace(path("hosts.tmp"), path("hosts"))
    mark(marker)

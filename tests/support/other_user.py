"""What another local user can read about this machine's processes: their command lines and environments.

A command line (``/proc/PID/cmdline``, what ``ps`` shows) is readable by every user; an environment
(``/proc/PID/environ``) only by the process's own user and root. A secret handed to a process on its
command line is therefore everybody's. ``read_as_nobody`` reads both, for every process, as the user
``nobody`` (root only: it drops to that user with ``setpriv``), so a test can look for a secret in what
came back. The secret itself is never handed to the reader: the test searches the reader's output.
"""

import os
import shutil
import subprocess

import pytest

NOBODY = 65534

# Every /proc/PID/{cmdline,environ} the reader can open, NUL-separated fields on lines, each file
# followed by a line naming it: "@@ /proc/PID/cmdline".
_READER = r"""
for p in /proc/[0-9]*; do
  for f in cmdline environ; do
    if tr '\000' '\n' < "$p/$f" 2>/dev/null; then echo; echo "@@ $p/$f"; fi
  done
done
"""

NEEDS_ROOT = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("setpriv") is None, reason="reading as another user needs root and setpriv"
)


def read_as_nobody() -> str:
    """Everything ``nobody`` can read in ``/proc/*/cmdline`` and ``/proc/*/environ`` now."""
    argv = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", "--", "/bin/sh", "-c", _READER]
    out = subprocess.run(argv, capture_output=True, timeout=60, cwd="/", stdin=subprocess.DEVNULL)
    assert out.returncode == 0, out.stderr.decode(errors="replace")
    return out.stdout.decode("utf-8", errors="replace")


def where(seen: str, text: str) -> list[str]:
    """The ``/proc/PID/{cmdline,environ}`` files in ``seen`` (``read_as_nobody``'s output) holding ``text``,
    each with the command line of that process: what a failing test names."""
    found, block = [], []
    for line in seen.splitlines():
        if line.startswith("@@ "):
            if any(text in field for field in block):
                path = line[3:]
                found.append(f"{path}: {' '.join(block)[:300]}")
            block = []
        else:
            block.append(line)
    return found

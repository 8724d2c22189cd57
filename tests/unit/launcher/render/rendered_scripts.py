"""Run a rendered bash script with a stand-in for the tool it starts, and read back the argv it got.

bash itself parses the script, so a word that comes back unchanged was quoted right; nothing but
the stand-in (a two-line bash script in a temporary folder) is started.
"""

import os
import shlex
import subprocess
from pathlib import Path


def argv_the_script_runs(text, tool, folder, env=None):
    """``(exit code, [argv of tool], stderr)`` after ``bash`` runs ``text`` with ``tool`` replaced by a recorder."""
    folder = Path(folder)
    stubs = folder / "stubs"
    stubs.mkdir(exist_ok=True)
    record = folder / "argv.bin"
    if record.exists():
        record.unlink()
    stub = stubs / tool
    stub.write_text(f"#!/bin/bash\nprintf '%s\\0' \"$@\" > {shlex.quote(str(record))}\n")
    stub.chmod(0o755)
    script = folder / "script.sh"
    script.write_bytes(text.encode("utf-8"))
    run_env = {"PATH": f"{stubs}{os.pathsep}/usr/bin:/bin", "LC_ALL": "C", **(env or {})}
    done = subprocess.run(["bash", str(script)], capture_output=True, env=run_env, timeout=30, stdin=subprocess.DEVNULL)
    if not record.exists():
        return done.returncode, None, done.stderr.decode("utf-8", "replace")
    words = record.read_bytes().split(b"\0")[:-1]
    return (
        done.returncode,
        [w.decode("utf-8", "surrogateescape") for w in words],
        done.stderr.decode("utf-8", "replace"),
    )


def bash_syntax_ok(text, folder):
    """``(ok, stderr)`` of ``bash -n`` on ``text``."""
    path = Path(folder) / "syntax.sh"
    path.write_bytes(text.encode("utf-8"))
    done = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True, timeout=30)
    return done.returncode == 0, done.stderr

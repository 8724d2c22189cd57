"""``python tune_fail_once.py MARKER SCRIPT ARGS...``: the first call anywhere (it creates MARKER, atomically)
exits 3 at once; every later call runs SCRIPT with ARGS as ``python SCRIPT ARGS`` would. hvdkit tune's
end-to-end test makes exactly one trial fail with it, whichever starts first."""

import os
import runpy
import sys

marker, script, *args = sys.argv[1:]
try:
    fd = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
except FileExistsError:
    sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
    sys.argv = [script, *args]
    runpy.run_path(script, run_name="__main__")
else:
    os.close(fd)
    print("tune_fail_once: injected failure of the first trial", file=sys.stderr, flush=True)
    sys.exit(3)

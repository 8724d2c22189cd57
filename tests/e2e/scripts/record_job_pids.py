"""A rank that records every process of its job, then runs for minutes unless something ends it.

    record_job_pids.py OUT_DIR LAUNCHER_PID

Writes OUT_DIR/rank-R.json: this rank's pid and those of its ancestors up to, not including,
LAUNCHER_PID (the rank wrapper, mpirun or horovodrun's shells and middlemen, horovodrun), and
the environment variables naming a folder that `hvdkit run` gave the ranks.
"""

import json
import os
import sys
import time

from hvdkit.core.topology import from_env


def parent_of(pid):
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[1])


out, launcher = sys.argv[1], int(sys.argv[2])
pids, pid = [], os.getpid()
while pid not in (launcher, 0, 1):
    pids.append(pid)
    pid = parent_of(pid)
folders = {k: v for k, v in os.environ.items() if k.startswith("HVDKIT_") and os.sep in v}
record = {"pids": pids, "reached_launcher": pid == launcher, "folders": folders}
path = os.path.join(out, f"rank-{from_env().rank}.json")
with open(path + ".tmp", "w") as f:
    json.dump(record, f)
os.replace(path + ".tmp", path)
time.sleep(600)

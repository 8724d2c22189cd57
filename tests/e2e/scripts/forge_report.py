"""A rank that claims another process as one of this job's ranks, through every channel a rank has.

    forge_report.py PID DIR

Rank 0 reports PID (a rank wrapper of another job on this host) as a rank of this job: as a pid
record in HVDKIT_STATUS_DIR when the launcher gives one (a folder shared with other jobs, e.g. a
shared TMPDIR), and as a start report on its output. Then rank 1 fails, which ends the job and
makes the launcher clean up every rank it knows of on this host (rank 1 waits for DIR/forged).
"""

import json
import os
import socket
import sys
import time

from hvdkit.core.topology import from_env

pid, done, rank, host = int(sys.argv[1]), os.path.join(sys.argv[2], "forged"), from_env().rank, socket.gethostname()
if rank == 0:
    folder = os.environ.get("HVDKIT_STATUS_DIR")
    if folder:
        with open(os.path.join(folder, "rank-7.pid"), "w") as f:
            f.write(f"{pid} {host}\n")
    job = os.environ.get("HVDKIT_JOB_ID", "")
    report = {"event": "start", "rank": 7, "pid": pid, "host": host}
    print(f"hvdkit-rank {job} {json.dumps(report)}", file=sys.stderr, flush=True)
    open(done, "w").close()
    time.sleep(120)
deadline = time.monotonic() + 120
while not os.path.exists(done) and time.monotonic() < deadline:
    time.sleep(0.1)
time.sleep(1)  # the report is on its way to the launcher
sys.exit(3)

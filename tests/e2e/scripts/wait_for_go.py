"""A rank that imports nothing heavy: writes OUT/ready.<rank> and waits (at most 120 s) for OUT/go.

hvdkit run -np 2 [--gloo] -- python wait_for_go.py OUT
"""

import os
import sys
import time

out = sys.argv[1]
rank = os.environ.get("HOROVOD_RANK") or os.environ.get("OMPI_COMM_WORLD_RANK") or "0"
with open(os.path.join(out, f"ready.{rank}"), "w") as f:
    f.write(str(os.getpid()))
deadline = time.monotonic() + 120
while not os.path.exists(os.path.join(out, "go")) and time.monotonic() < deadline:
    time.sleep(0.1)
print("ENDED", rank, flush=True)

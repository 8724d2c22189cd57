"""A tiny rank program for launcher tests (no framework): greet, then fail as told.

rank_behaviour.py hello                 every rank prints a line and exits 0
rank_behaviour.py exit RANK CODE        RANK exits with CODE; the others wait 120 s
rank_behaviour.py kill RANK             RANK kills itself with SIGKILL; the others wait 120 s
"""

import os
import signal
import sys
import time

from hvdkit.core.topology import from_env

rank = from_env().rank
print(f"hello from rank {rank}", flush=True)
mode = sys.argv[1]
if mode == "exit" and rank == int(sys.argv[2]):
    print(f"rank {rank} failing on purpose", file=sys.stderr, flush=True)
    sys.exit(int(sys.argv[3]))
if mode == "kill" and rank == int(sys.argv[2]):
    os.kill(os.getpid(), signal.SIGKILL)
if mode != "hello":
    time.sleep(120)  # only a prompt tear-down by the launcher ends this rank in time

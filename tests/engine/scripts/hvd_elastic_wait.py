"""A Horovod elastic job that shows the test its rendezvous server and waits for the test's go.

    horovodrun -np 1 --min-np 1 --host-discovery-script D --gloo python hvd_elastic_wait.py OUT

Rank 0 writes OUT/rendezvous.json ({"addr", "port"}: where workers register; "key": the job's key, which
only this test may read: OUT is the test's own 0700 folder), then waits (at most 120 s)
for OUT/go, commits once and ends.
"""

import json
import os
import sys
import time

import horovod.torch as hvd

OUT = sys.argv[1]
hvd.init()
state = hvd.elastic.TorchState(done=False)


@hvd.elastic.run
def train(state):
    if hvd.rank() == 0:
        where = {
            "addr": os.environ["HOROVOD_GLOO_RENDEZVOUS_ADDR"],
            "port": int(os.environ["HOROVOD_GLOO_RENDEZVOUS_PORT"]),
            # What a thief would want: the test checks that no other user can read it anywhere.
            "key": os.environ.get("HOROVOD_RENDEZVOUS_KEY"),
            "host": os.environ["HOROVOD_HOSTNAME"],
            "local_rank": int(os.environ["HOROVOD_LOCAL_RANK"]),
        }
        with open(os.path.join(OUT, "rendezvous.tmp"), "w") as f:
            json.dump(where, f)
        os.replace(os.path.join(OUT, "rendezvous.tmp"), os.path.join(OUT, "rendezvous.json"))
    deadline = time.monotonic() + 120
    while not os.path.exists(os.path.join(OUT, "go")) and time.monotonic() < deadline:
        time.sleep(0.1)
    state.done = True
    state.commit()


train(state)
print("ENDED", hvd.rank(), flush=True)

#!/bin/bash
# The plain mpirun line for this job, to start it without `hvdkit run`.
# Job hvdkit-digits: `python examples/torch_digits.py` with -np 4 on 2 node(s) x 2 slot(s).
# Rendered by hvdkit from one job description; change the description and render again:
#   hvdkit render mpirun --name hvdkit-digits -np 4 --nodes 2 --slots-per-node 2 -- python examples/torch_digits.py
# It is what this prints, less hvdkit's rank wrapper:
#   hvdkit run --dry-run -np 4 -H node1:2,node2:2 -- python examples/torch_digits.py
# Put your hosts in -H, or replace `-H ...` by `--hostfile FILE` (see hostfile.example).
# As root add --allow-run-as-root.
set -euo pipefail
export PYTHONUNBUFFERED=1
exec mpirun -np 4 -H node1:2,node2:2 --bind-to none --map-by slot --tag-output -x PATH -x PYTHONUNBUFFERED python examples/torch_digits.py

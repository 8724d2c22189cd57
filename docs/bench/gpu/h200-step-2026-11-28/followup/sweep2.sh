#!/usr/bin/env bash
# second device run: engine build, then chosen breakdown jobs; JSON after each job
set -u
root=$(pwd); O=/tmp/gs2; mkdir -p $O
export PYTHONPATH=$root PYTHONUNBUFFERED=1
t0=$(date +%s); deadline=$((t0 + ${TOTAL:-300}))
python3 -m pip install -q --no-index --no-deps .carry/wheels/*.whl
export PATH="$PATH:$root/.carry/bin"
python3 -c "import horovod.torch as h,sys;sys.exit(0 if h.nccl_built() else 1)" 2>/dev/null || HVDKIT_BUILD_JOBS=16 PYTHON=python3 timeout 200 bash scripts/build-horovod.sh --gpu > $O/build.log 2>&1; echo "build rc $? at $(( $(date +%s) - t0 )) s"
export HVDKIT_SHARE_GPUS=1 NCCL_SOCKET_IFNAME=lo NCCL_IB_DISABLE=1 NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 NCCL_NVLS_ENABLE=0 HVDKIT_PER_RANK_HOSTID=1
hr=$(dirname $(python3 -c 'import sys;print(sys.executable)'))/horovodrun
job() { # name models variants env...
  local name=$1 models=$2 variants=$3; shift 3
  local left=$((deadline - $(date +%s)))
  [[ $left -lt 25 ]] && { echo "$name skipped ($left s left)"; return; }
  local s=$(date +%s)
  env "$@" timeout $((left - 3)) $hr -np 2 -H localhost:2 --gloo python3 -m hvdkit.bench.breakdown $O/$name.json --device cuda --models $models --variants $variants --steps=16 --warmup=5 --reps=2 > $O/$name.log 2>&1
  echo "$name rc $? in $(( $(date +%s) - s )) s"
}
job cycle5-both resnet50,bert ddp,hvdkit,hvdkit_bucket HOROVOD_CYCLE_TIME=5
job async-both resnet50,bert ddp,hvdkit HOROVOD_ENABLE_ASYNC_COMPLETION=1
job cycle10-r50 resnet50 ddp,hvdkit HOROVOD_CYCLE_TIME=10
job cycle5-bucket-async resnet50,bert ddp,hvdkit_bucket HOROVOD_CYCLE_TIME=5 HOROVOD_ENABLE_ASYNC_COMPLETION=1
job streams2-r50 resnet50 ddp,hvdkit HOROVOD_NUM_NCCL_STREAMS=2
job d2d-r50 resnet50 ddp,hvdkit HOROVOD_BATCH_D2D_MEMCOPIES=1
echo "done at $(( $(date +%s) - t0 )) s"

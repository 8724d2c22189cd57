#!/usr/bin/env bash
# Why is Horovod's training step slower than DDP's? (issue 39, docs/gpu.md) On a machine with an NVIDIA
# GPU and a CUDA build of torch: build the NCCL engine with the packaged recipe, as scripts/gpu-proof.sh
# does (skipped when the installed engine has NCCL already: a rerun on a warm machine), then run the
# step breakdown and the sweep of Horovod's settings (python -m hvdkit.bench.step_sweep) in what is
# left of TOTAL. step_sweep.json is rewritten after every job, so a run cut off keeps what it measured;
# the table and plot of whatever was measured are drawn at the end.
#
#   OUT=gpu-step PYTHON=python3 bash scripts/gpu-step.sh
#
# Env: OUT (default gpu-step), PYTHON (default python3), HVDKIT_HOROVOD_SDIST, CUDA_ARCHS (default: the
# visible GPUs'), BUILD_TIMEOUT (seconds, default 300), TOTAL (seconds for everything, default 480),
# SWEEP_ARGS (more flags for step_sweep), DRY_RUN=1 (no build, no job: the sweep's plan, also on CPU).
set -uo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
OUT=${OUT:-gpu-step}
PY=${PYTHON:-python3}
mkdir -p "$OUT"
t0=$(date +%s)
deadline=$((t0 + ${TOTAL:-480}))
left() { echo $((deadline - $(date +%s))); }
step() { printf '[gpu-step %4ss] %s\n' "$(($(date +%s) - t0))" "$*"; }
export PYTHONPATH="$root${PYTHONPATH:+:$PYTHONPATH}"

if [[ ${DRY_RUN:-0} == 1 ]]; then
  step "dry run: the sweep's plan (no engine build, no job)"
  "$PY" -m hvdkit.bench.step_sweep "$OUT" --dry-run ${SWEEP_ARGS:-} 2>&1 | tee "$OUT/sweep.txt"
  exit "${PIPESTATUS[0]}"
fi

step "environment"
{
  nvidia-smi --query-gpu=name,memory.total,driver_version,compute_cap --format=csv
  "$PY" -c 'import sys, torch; print(sys.version.split()[0], torch.__version__, "CUDA", torch.version.cuda, "NCCL", torch.cuda.nccl.version(), torch.cuda.get_device_name(0))'
  nproc; uptime
} > "$OUT/env.txt" 2>&1
cat "$OUT/env.txt"
for t in patch make; do  # tools a bare image may lack, carried along in .carry/bin (as gpu-proof.sh)
  command -v "$t" >/dev/null || { [[ -x .carry/bin/$t ]] && export PATH="$PATH:$root/.carry/bin" && step "using carried $t"; }
done
if compgen -G ".carry/wheels/*.whl" >/dev/null && ! "$PY" -c 'import cffi' 2>/dev/null; then
  "$PY" -m pip install -q --no-index --no-deps .carry/wheels/*.whl && step "installed carried wheels"
fi

if "$PY" -c 'import horovod.torch as h, sys; sys.exit(0 if h.nccl_built() else 1)' 2>/dev/null; then
  step "engine: the installed Horovod has NCCL already, not rebuilt"
else
  step "engine: build with NCCL (scripts/build-horovod.sh --gpu)"
  archs=()
  [[ -n ${CUDA_ARCHS:-} ]] && archs=(--cuda-archs "$CUDA_ARCHS")
  bstart=$(date +%s)
  HVDKIT_BUILD_JOBS=$(nproc) PYTHON=$PY timeout "${BUILD_TIMEOUT:-300}" bash scripts/build-horovod.sh --gpu "${archs[@]}" > "$OUT/build.log" 2>&1
  step "engine build exit $? in $(($(date +%s) - bstart)) s"
  grep -E '^\[build-horovod\]|error|Error|FAILED' "$OUT/build.log" | tail -20
fi
bindir=$(dirname "$("$PY" -c 'import sys; print(sys.executable)')")
"$bindir/horovodrun" --check-build > "$OUT/check-build.txt" 2>&1
cat "$OUT/check-build.txt"

sweep_s=$(($(left) - 20))
step "step breakdown and sweep: $sweep_s s (jobs that would not fit are skipped)"
timeout "$sweep_s" "$PY" -m hvdkit.bench.step_sweep "$OUT" --budget $((sweep_s - 10)) ${SWEEP_ARGS:-} > "$OUT/sweep.txt" 2>&1
rc=$?
step "sweep exit $rc"
if [[ $rc -ne 0 && -f $OUT/step_sweep.json ]]; then  # cut off: the table and plot of what it measured
  timeout 15 "$PY" -m hvdkit.bench.step_sweep --report "$OUT/step_sweep.json" >> "$OUT/sweep.txt" 2>&1
fi
grep -vE '^\s*$' "$OUT/sweep.txt" | tail -60
step "done"

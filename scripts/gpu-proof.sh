#!/usr/bin/env bash
# The GPU proof (issue 22, docs/gpu.md): on a machine with an NVIDIA GPU and a CUDA build of torch,
# build the NCCL engine with the packaged recipe, then run tests/gpu and the GPU benchmark.
# Works offline: HVDKIT_HOROVOD_SDIST names the Horovod sdist to build. Each step is bounded and
# logged under $OUT; a failing step does not stop the ones that can still run.
#
#   OUT=gpu-proof PYTHON=python3 bash scripts/gpu-proof.sh
#
# Env: OUT (default gpu-proof), PYTHON (default python3), HVDKIT_HOROVOD_SDIST, CUDA_ARCHS (default:
# the visible GPUs'), BUILD_TIMEOUT / TEST_TIMEOUT / DOCTOR_TIMEOUT (seconds), BENCH_ARGS, and TOTAL: the
# seconds the whole proof may take (default 560); the benchmark gets what is left of it and keeps
# what it measured when cut off (gpu_bench.json is rewritten after each job).
set -uo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
OUT=${OUT:-gpu-proof}
PY=${PYTHON:-python3}
mkdir -p "$OUT"
t0=$(date +%s)
deadline=$((t0 + ${TOTAL:-560}))
left() { echo $((deadline - $(date +%s))); }
step() { printf '[gpu-proof %4ss] %s\n' "$(($(date +%s) - t0))" "$*"; }

step "environment"
{
  nvidia-smi --query-gpu=name,memory.total,driver_version,compute_cap --format=csv
  "$PY" -c 'import sys, torch; print(sys.version.split()[0], torch.__version__, "CUDA", torch.version.cuda, "NCCL", torch.cuda.nccl.version(), torch.cuda.get_device_name(0))'
  for t in nvcc g++ cmake make patch mpirun mpicc ninja; do printf '%s: %s\n' "$t" "$(command -v "$t" || echo missing)"; done
  ls -d /usr/local/cuda* 2>&1; ls /usr/local/cuda/bin/nvcc 2>&1
  "$PY" -c 'import sysconfig, os; i = sysconfig.get_paths()["include"]; print("Python.h:", os.path.exists(os.path.join(i, "Python.h")), i)'
  ldconfig -p | grep -E 'libcuda\.so|libnccl' || true
} > "$OUT/env.txt" 2>&1
cat "$OUT/env.txt"
# Tools a bare image may lack, carried along in .carry/bin (Debian's patch and make).
for t in patch make; do
  command -v "$t" >/dev/null || { [[ -x .carry/bin/$t ]] && export PATH="$PATH:$root/.carry/bin" && step "using carried $t"; }
done

# Build-time Python packages a bare image may lack (Horovod's setup.py needs cffi), carried as wheels.
if compgen -G ".carry/wheels/*.whl" >/dev/null && ! "$PY" -c 'import cffi' 2>/dev/null; then
  "$PY" -m pip install -q --no-index --no-deps .carry/wheels/*.whl && step "installed carried wheels: $(ls .carry/wheels | tr '\n' ' ')"
fi

step "engine: build with NCCL (scripts/build-horovod.sh --gpu)"
archs=()
[[ -n ${CUDA_ARCHS:-} ]] && archs=(--cuda-archs "$CUDA_ARCHS")
PYTHON=$PY bash scripts/build-horovod.sh --dry-run --gpu "${archs[@]}" > "$OUT/plan.txt" 2>&1
cat "$OUT/plan.txt"
bstart=$(date +%s)
HVDKIT_BUILD_JOBS=$(nproc) PYTHON=$PY timeout "${BUILD_TIMEOUT:-360}" bash scripts/build-horovod.sh --gpu "${archs[@]}" > "$OUT/build.log" 2>&1
build_rc=$?
step "engine build exit $build_rc in $(($(date +%s) - bstart)) s"
grep -E '^\[build-horovod\]|error|Error|FAILED' "$OUT/build.log" | tail -40
bindir=$(dirname "$("$PY" -c 'import sys; print(sys.executable)')")
"$bindir/horovodrun" --check-build > "$OUT/check-build.txt" 2>&1
cat "$OUT/check-build.txt"
ls -la "$("$PY" -c 'import os; print(os.path.expanduser("~/.cache/hvdkit/wheels"))')"/*/ >> "$OUT/check-build.txt" 2>&1
export PYTHONPATH="$root${PYTHONPATH:+:$PYTHONPATH}"

step "hvdkit doctor (GPUs, driver, CUDA, NCCL, a 2-rank NCCL allreduce) in the background, beside the tests"
timeout "${DOCTOR_TIMEOUT:-120}" "$PY" -m hvdkit doctor > "$OUT/doctor.tmp" 2>&1 &
doctor_pid=$!

step "tests/gpu and the pure GPU unit tests"
timeout "${TEST_TIMEOUT:-200}" "$PY" -m pytest -q -ra -p no:cacheprovider tests/gpu tests/unit/core/test_devices.py \
  tests/unit/engine/test_engine_plan.py > "$OUT/tests.txt" 2>&1
step "tests exit $?"
tail -40 "$OUT/tests.txt"

wait "$doctor_pid"
step "doctor exit $? (appended to check-build.txt)"
grep -iE 'gpu|cuda|nccl|driver|allreduce|passed|failed' "$OUT/doctor.tmp"
{ echo; echo "== hvdkit doctor"; cat "$OUT/doctor.tmp"; } >> "$OUT/check-build.txt"
rm -f "$OUT/doctor.tmp"

step "benchmark: hvdkit/Horovod-NCCL vs DDP-NCCL, allreduce bandwidth"
bench_s=$(($(left) - 15))
step "benchmark gets $bench_s s"
timeout "$bench_s" "$PY" -m benchmarks.gpu_bench "$OUT" ${BENCH_ARGS:-} > "$OUT/bench.txt" 2>&1
bench_rc=$?
step "benchmark exit $bench_rc"
if [[ $bench_rc -ne 0 && -f $OUT/gpu_bench.json ]]; then  # cut off: the table and plot of what it measured
  timeout 30 "$PY" -m benchmarks.gpu_bench --report "$OUT/gpu_bench.json" >> "$OUT/bench.txt" 2>&1
fi
tail -40 "$OUT/bench.txt"
step "done"

#!/usr/bin/env bash
# `make engine-gpu`: the GPU (NCCL) Horovod engine, built on a machine without a GPU, in its own venv.
#   1. a virtualenv (default .venv-gpu, python3.11) with PyPI's CUDA torch (it brings nvidia-nccl-cu13
#      and the CUDA 13 runtime wheels) and what Horovod's wheel requires;
#   2. the CUDA compiler toolkit from PyPI's NVIDIA wheels, at the CUDA release of that torch
#      (scripts/cuda-toolkit-wheels.sh, which docker/Dockerfile.gpu uses too);
#   3. the engine: scripts/build-horovod.sh --gpu --cuda-archs ARCHS (the one recipe; the wheel is cached
#      under its key like the CPU engine's), against that toolkit and no other (HOROVOD_CUDA_HOME);
#   4. checks that need no GPU: horovod.torch imports, hvd.init() works and says NCCL and Gloo are built
#      in, and a 2-rank allreduce of a CPU tensor over Gloo (horovodrun --gloo) and over MPI (mpirun).
# CUDA tensors need a GPU: tests/gpu (docs/gpu.md) on a GPU machine.
#
# Env:
#   HVDKIT_GPU_VENV      the virtualenv (default: .venv-gpu in the repository; git-ignored)
#   HVDKIT_GPU_PYTHON    the interpreter that makes it (default: python3.11)
#   HVDKIT_GPU_TORCH     torch version (default: 2.14.1, a CUDA 13.0 build on PyPI)
#   HVDKIT_CUDA_ARCHS    CUDA architectures (default: 90, H100/H200); e.g. 80,90,100
#   HVDKIT_BUILD_JOBS    parallel compile jobs (default: number of cores)
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
venv=${HVDKIT_GPU_VENV:-$root/.venv-gpu}
base=${HVDKIT_GPU_PYTHON:-python3.11}
torch_version=${HVDKIT_GPU_TORCH:-2.14.1}
archs=${HVDKIT_CUDA_ARCHS:-90}
start=$SECONDS
say() { printf '[engine-gpu %4ds] %s\n' "$((SECONDS - start))" "$*" >&2; }
die() { printf '[engine-gpu] ERROR: %s\n' "$*" >&2; exit 1; }

py=$venv/bin/python
if [[ ! -x $py ]]; then
  command -v "$base" >/dev/null || die "no $base: set HVDKIT_GPU_PYTHON to a Python 3.11 interpreter"
  say "making $venv with $base"
  "$base" -m venv "$venv"
  "$py" -m pip install --quiet --upgrade pip setuptools wheel
fi

say "installing torch==$torch_version (PyPI's CUDA build: several GB the first time) and Horovod's requirements"
"$py" -m pip install --quiet "torch==$torch_version" numpy cloudpickle psutil pyyaml packaging
"$py" -c 'import torch, sys; sys.exit(0 if torch.version.cuda else f"torch {torch.__version__} is a CPU build")' \
  || die "PyPI gave a CPU torch; install a CUDA build into $venv"

cuda_home=$(PYTHON=$py bash "$root/scripts/cuda-toolkit-wheels.sh")

say "building the GPU engine for CUDA architectures $archs (about 8 minutes on 2 cores the first time)"
HOROVOD_CUDA_HOME=$cuda_home PYTHON=$py bash "$root/scripts/build-horovod.sh" --gpu --cuda-archs "$archs"

say "check: horovod.torch loads, hvd.init(), NCCL and Gloo built in"
"$py" -c 'import torch, horovod.torch as hvd
hvd.init()
print(f"torch {torch.__version__} (CUDA {torch.version.cuda}), horovod.torch size {hvd.size()}, "
      f"nccl_built {hvd.nccl_built()}, gloo_built {hvd.gloo_built()}, mpi_built {hvd.mpi_built()}")
assert hvd.nccl_built() and hvd.gloo_built(), "the engine lacks NCCL or Gloo"'

check=$(mktemp --suffix=.py)
trap 'rm -f "$check"' EXIT
cat > "$check" <<'EOF'
import torch, horovod.torch as hvd
hvd.init()
out = hvd.allreduce(torch.full((4,), float(hvd.rank() + 1)), op=hvd.Sum, name="engine_gpu_check")
assert out.tolist() == [3.0] * 4, out
print(f"rank {hvd.rank()}/{hvd.size()}: CPU allreduce ok {out.tolist()}")
EOF
bin=$venv/bin
as_root=()
[[ $(id -u) -eq 0 ]] && as_root=(--allow-run-as-root)
say "check: 2-rank allreduce of a CPU tensor over Gloo (horovodrun --gloo)"
PATH="$bin:$PATH" timeout 120 "$bin/horovodrun" -np 2 --gloo "$py" "$check"
if command -v mpirun >/dev/null && "$py" -c 'import horovod.torch as hvd, sys; sys.exit(not hvd.mpi_built())'; then
  say "check: 2-rank allreduce of a CPU tensor over MPI (mpirun)"
  PATH="$bin:$PATH" timeout 120 mpirun "${as_root[@]}" --oversubscribe -np 2 "$py" "$check"
fi
wheel_dir=$(HOROVOD_CUDA_HOME=$cuda_home PYTHON=$py bash "$root/scripts/build-horovod.sh" --gpu --cuda-archs "$archs" --key)
wheel=$(ls "$wheel_dir"/horovod-*.whl | head -n 1)
say "ok: GPU engine in $venv ($(du -h "$wheel" | cut -f1) wheel: $wheel); CUDA tensors need a GPU (tests/gpu)"

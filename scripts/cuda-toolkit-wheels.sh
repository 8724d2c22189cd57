#!/usr/bin/env bash
# Install the CUDA compiler toolkit that matches the CUDA torch of $PYTHON's environment, from PyPI's
# NVIDIA wheels, and print its folder (the HOROVOD_CUDA_HOME of a GPU engine build) on stdout.
# `make engine-gpu` (scripts/engine-gpu.sh) and docker/Dockerfile.gpu use it: one toolkit for both.
#
# torch's CUDA 13 wheels depend on the `cuda-toolkit` meta-package at the exact CUDA release they were
# built with (torch 2.14.1: cuda-toolkit 13.0.3); its extras nvcc, crt, cccl and cudart add the
# compiler (nvcc, ptxas, cicc), its C++ front-end headers and the runtime headers and libraries
# (cuda_runtime.h, libcudart.so.13, libcudart_static.a), all in one tree, site-packages/nvidia/cu13.
# A torch without that meta-package (CUDA 12) gets nvidia-cuda-nvcc-cu12 etc. at torch.version.cuda.
# No libcuda stub is needed: Horovod links the CUDA runtime only and opens the driver with dlopen.
# The build recipe lays the tree out as /usr/local/cuda for nvcc and CMake (build-horovod.sh, G5).
#
# Env: PYTHON (default python3).
set -euo pipefail
PYTHON=${PYTHON:-python3}
say() { printf '[cuda-toolkit-wheels] %s\n' "$*" >&2; }
die() { printf '[cuda-toolkit-wheels] ERROR: %s\n' "$*" >&2; exit 1; }

read -r torch_cuda meta < <("$PYTHON" - <<'EOF'
from importlib.metadata import version, PackageNotFoundError
import torch
try:
    meta = version("cuda-toolkit")
except PackageNotFoundError:
    meta = "-"
print(torch.version.cuda or "-", meta)
EOF
) || die "could not import torch with $PYTHON"
[[ $torch_cuda != - ]] || die "torch in $PYTHON is a CPU build: install a CUDA torch first (PyPI's default torch is one)"
major=${torch_cuda%%.*}
if [[ $meta != - ]]; then
  want=("cuda-toolkit[nvcc,crt,cccl,cudart]==$meta")
else
  want=("nvidia-cuda-nvcc-cu$major==$torch_cuda.*" "nvidia-cuda-runtime-cu$major==$torch_cuda.*"
    "nvidia-cuda-cccl-cu$major==$torch_cuda.*")
fi
say "torch is built with CUDA $torch_cuda: installing ${want[*]}"
"$PYTHON" -m pip install --quiet "${want[@]}" >&2

home=$("$PYTHON" - "$major" <<'EOF'
import os, sys, sysconfig
site = sysconfig.get_paths()["purelib"]
for d in (f"cu{sys.argv[1]}", "cuda_nvcc"):
    home = os.path.join(site, "nvidia", d)
    if os.path.isfile(os.path.join(home, "bin", "nvcc")):
        print(home)
        break
EOF
)
[[ -n $home ]] || die "no nvcc in $PYTHON's site-packages/nvidia after installing ${want[*]}"
for f in bin/nvcc include/cuda_runtime.h; do [[ -e $home/$f ]] || die "the toolkit wheels lack $f in $home"; done
compgen -G "$home/lib/libcudart.so.*" >/dev/null || compgen -G "$home/lib64/libcudart.so*" >/dev/null \
  || die "the toolkit wheels lack libcudart.so in $home/lib"
say "toolkit: $home ($("$home/bin/nvcc" --version | sed -n 's/.*\(release [0-9.]*\).*/\1/p'))"
echo "$home"

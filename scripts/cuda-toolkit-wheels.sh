#!/usr/bin/env bash
# Install the CUDA compiler toolkit that matches the CUDA torch of $PYTHON's environment, from PyPI's
# NVIDIA wheels, and print its folder (the HOROVOD_CUDA_HOME of a GPU engine build) on stdout.
# `make engine-gpu` (scripts/engine-gpu.sh) and docker/Dockerfile.gpu use it: one toolkit for both.
#
# torch's CUDA 13 wheels depend on the `cuda-toolkit` meta-package at the exact CUDA release they were
# built with (torch 2.14.1: cuda-toolkit 13.0.3); its extras nvcc, crt, cccl and cudart add the
# compiler (nvcc, ptxas, cicc), its C++ front-end headers and the runtime headers and libraries
# (cuda_runtime.h, libcudart.so.13, libcudart_static.a), all in one tree, site-packages/nvidia/cu13.
# A CUDA 13 torch without that meta-package gets it at its CUDA release (cuda-toolkit==13.0.*).
# CUDA 12 is refused: PyPI's CUDA 12 wheels hold no compiler (nvidia-cuda-nvcc-cu12 12.6 to 12.9
# carries ptxas, libnvvm and crt headers, no nvcc, cicc or fatbinary; the runtime is apart, in
# nvidia/cuda_runtime), so no tree built from them compiles; such a build takes NVIDIA's CUDA 12
# toolkit through HOROVOD_CUDA_HOME (tests/unit/engine/test_cuda_toolkit_wheels.py has the file lists).
# No libcuda stub is needed: Horovod links the CUDA runtime only and opens the driver with dlopen.
# The build recipe lays the tree out as /usr/local/cuda for nvcc and CMake (build-horovod.sh, G5).
#
# Sourced (`source cuda-toolkit-wheels.sh`), it defines its functions and runs nothing.
# Env: PYTHON (default python3).
set -euo pipefail
PYTHON=${PYTHON:-python3}
say() { printf '[cuda-toolkit-wheels] %s\n' "$*" >&2; }
die() { printf '[cuda-toolkit-wheels] ERROR: %s\n' "$*" >&2; exit 1; }

# toolkit_wheels CUDA META: the pip requirement of a compiler toolkit for torch's CUDA release CUDA,
# given the installed cuda-toolkit meta-package's version META ("-" when there is none).
toolkit_wheels() {
  local cuda=$1 meta=$2 major=${1%%.*}
  if ((major < 13)); then
    die "torch is built with CUDA $cuda, and PyPI's CUDA $major wheels hold no compiler (nvidia-cuda-nvcc-cu$major:" \
      "ptxas and libnvvm, no nvcc). Install NVIDIA's CUDA $cuda toolkit (its apt repository's" \
      "cuda-toolkit-${cuda/./-}, or the runfile) and build with HOROVOD_CUDA_HOME=/usr/local/cuda-$cuda" \
      "(scripts/build-horovod.sh --gpu), or use a torch built with CUDA 13"
  fi
  [[ $meta != - ]] || meta="$cuda.*"
  echo "cuda-toolkit[nvcc,crt,cccl,cudart]==$meta"
}

# check_tree HOME: return when HOME holds what a build needs (nvcc, cuda_runtime.h, libcudart.so),
# else stop naming the first thing missing.
check_tree() {
  local home=$1 f
  for f in bin/nvcc include/cuda_runtime.h; do [[ -e $home/$f ]] || die "the toolkit wheels lack $f in $home"; done
  compgen -G "$home/lib/libcudart.so.*" >/dev/null || compgen -G "$home/lib64/libcudart.so*" >/dev/null \
    || die "the toolkit wheels lack libcudart.so in $home/lib"
}

main() {
  local torch_cuda meta site want home
  read -r torch_cuda meta site < <("$PYTHON" - <<'EOF'
from importlib.metadata import version, PackageNotFoundError
import sysconfig
import torch
try:
    meta = version("cuda-toolkit")
except PackageNotFoundError:
    meta = "-"
print(torch.version.cuda or "-", meta, sysconfig.get_paths()["purelib"])
EOF
  ) || die "could not import torch with $PYTHON"
  [[ -n ${site:-} ]] || die "could not import torch with $PYTHON"
  [[ $torch_cuda != - ]] || die "torch in $PYTHON is a CPU build: install a CUDA torch first (PyPI's default torch is one)"
  want=$(toolkit_wheels "$torch_cuda" "$meta") || exit 1
  say "torch is built with CUDA $torch_cuda: installing $want"
  "$PYTHON" -m pip install --quiet "$want" >&2
  home=$site/nvidia/cu${torch_cuda%%.*}
  check_tree "$home"
  say "toolkit: $home ($("$home/bin/nvcc" --version | sed -n 's/.*\(release [0-9.]*\).*/\1/p'))"
  echo "$home"
}

if ! (return 0 2>/dev/null); then # run, not sourced (`return` works only in a sourced file)
  main "$@"
fi

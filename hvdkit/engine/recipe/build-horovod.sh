#!/usr/bin/env bash
# Build (or reuse) the Horovod engine for the Python environment given by $PYTHON and install it.
#
#   build-horovod.sh [--gpu|--cpu] [--cuda-archs 90,100]   build or reuse the wheel, install it, check it
#   build-horovod.sh --key        print the wheel cache folder for $PYTHON (its name ends in the key); build nothing
#   build-horovod.sh --dry-run    print the build plan: variant, exact settings, wheel folder; build nothing
#
# GPU: when the installed torch is a CUDA build (or with --gpu) the engine is built with NCCL
# (HOROVOD_GPU_OPERATIONS=NCCL) against the CUDA toolkit and the NCCL that torch uses; engine_plan.py
# next to this script decides the variant and its settings (docs/gpu.md). A plain CPU build has
# exactly the settings and the cache key it had before GPU builds existed.
#
# Horovod 0.28.1 from PyPI does not compile against torch >= 2.1 or TensorFlow >= 2.10 (their
# headers need C++17). The recipe patches the sdist's build files (horovod-build/*.patch next to this
# script: 01-09 every build, 1N-gpu-* GPU builds), applies hvdkit's engine fixes
# (horovod-fixes/*.patch, by apply-horovod-fixes.sh) and builds a wheel with MPI,
# Gloo, PyTorch and TensorFlow. The wheel is cached under a key made of every input (the fixes
# included), so a second run only reinstalls it. A stamp in the environment records the installed
# engine once `horovodrun --check-build` (about 25 s) passed for it, so a run that finds that same
# engine installed neither reinstalls nor checks it again.
#
# This script ships inside the hvdkit package (hvdkit/engine/recipe/): `hvdkit engine install` runs
# it for its own interpreter, scripts/build-horovod.sh (`make setup`, docker/Dockerfile) for the
# venv's. One recipe, one key: a wheel either of them built is a cache hit for the other.
#
# Env:
#   PYTHON               interpreter of the target environment (default: python3)
#   HOROVOD_VERSION      sdist version to build (default 0.28.1; scripts/build-horovod.sh passes constraints.txt's)
#   HOROVOD_SDIST_SHA256 the SHA-256 its sdist must have (default: the pinned one of 0.28.1; another
#                        version needs it); part of the cache key, and a download that differs is refused
#   HVDKIT_WHEEL_CACHE   wheel cache folder (default: ${XDG_CACHE_HOME:-~/.cache}/hvdkit/wheels)
#   HVDKIT_BUILD_JOBS    parallel compile jobs (default: number of cores)
#   HVDKIT_ENGINE_GPU    auto (default: NCCL when torch is a CUDA build), on (--gpu) or off (--cpu)
#   HVDKIT_CUDA_ARCHS    CUDA architectures of a GPU build, e.g. 90 or 80,90,100 (--cuda-archs; default:
#                        the visible GPUs', else engine_plan.DEFAULT_CUDA_ARCHS)
#   HVDKIT_HOROVOD_SDIST the Horovod sdist to build, for a machine without a package index (checked
#                        against the pinned SHA-256 like a download)
#   HOROVOD_CUDA_HOME    the CUDA toolkit of a GPU build (default: nvcc on PATH, /usr/local/cuda, the pip wheels)
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
PYTHON=${PYTHON:-python3}
HOROVOD_VERSION=${HOROVOD_VERSION:-0.28.1}
CACHE=${HVDKIT_WHEEL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/hvdkit/wheels}
JOBS=${HVDKIT_BUILD_JOBS:-$(nproc)}
# The sdists this recipe was checked with, by version (PyPI's published digests).
declare -A PINNED_SDIST_SHA256=([0.28.1]=92a43f5a94c43907a56805bad15f19700c62ffc83b7ca483f9e104e229f67ef0)

say() { printf '[build-horovod] %s\n' "$*" >&2; }
die() { printf '[build-horovod] ERROR: %s\n' "$*" >&2; exit 1; }

mode=install
GPU_MODE=${HVDKIT_ENGINE_GPU:-auto}
CUDA_ARCHS=${HVDKIT_CUDA_ARCHS:-}
while (($#)); do
  case $1 in
    --key) mode=key ;;
    --dry-run) mode=dry-run ;;
    --gpu) GPU_MODE=on ;;
    --cpu) GPU_MODE=off ;;
    --cuda-archs)
      (($# >= 2)) || die "--cuda-archs needs a value, e.g. --cuda-archs 90"
      CUDA_ARCHS=$2
      shift ;;
    --cuda-archs=*) CUDA_ARCHS=${1#--cuda-archs=} ;;
    *) die "unknown argument '$1'; usage: build-horovod.sh [--key|--dry-run] [--gpu|--cpu] [--cuda-archs LIST]" ;;
  esac
  shift
done
case $GPU_MODE in
  auto | on | off) ;;
  1 | yes | true) GPU_MODE=on ;;
  0 | no | false) GPU_MODE=off ;;
  *) die "HVDKIT_ENGINE_GPU='$GPU_MODE' is not auto, on or off" ;;
esac

# need TOOL:PACKAGE:WHAT ...: every missing tool, with the Debian package that has it, in one error.
need() {
  local item tool pkg what list missing=() pkgs=()
  for item in "$@"; do
    IFS=: read -r tool pkg what <<<"$item"
    command -v "$tool" >/dev/null || { missing+=("$tool ($what; Debian package $pkg)"); pkgs+=("$pkg"); }
  done
  ((${#missing[@]} == 0)) && return
  printf -v list '%s, ' "${missing[@]}"
  die "missing: ${list%, }. Install them: apt-get install -y ${pkgs[*]}"
}

sdist_sha256=${HOROVOD_SDIST_SHA256:-${PINNED_SDIST_SHA256[$HOROVOD_VERSION]:-}}
[[ $sdist_sha256 =~ ^[0-9a-f]{64}$ ]] || die "no SHA-256 of the Horovod $HOROVOD_VERSION sdist is pinned${HOROVOD_SDIST_SHA256:+ (HOROVOD_SDIST_SHA256='$HOROVOD_SDIST_SHA256' is not 64 hex digits)}; set HOROVOD_SDIST_SHA256 to the digest PyPI lists for horovod-$HOROVOD_VERSION.tar.gz"
command -v "$PYTHON" >/dev/null || die "no interpreter '$PYTHON'; set PYTHON to the target environment's python"
# A relative path (PYTHON=.venv/bin/python) would name nothing once the build cds into the sdist: make
# it absolute, without resolving the venv's symlink (that would be the base interpreter, not the venv).
if [[ $PYTHON == */* ]]; then PYTHON=$(cd "$(dirname "$PYTHON")" && pwd)/$(basename "$PYTHON"); fi
# The key needs the compiler and MPI versions; a build needs more (checked on a cache miss). Without
# Open MPI (no mpirun) the engine is built with Gloo alone (engine_plan.py says so); with its runtime
# but not its headers, a build asks for them (libopenmpi-dev) instead of quietly leaving MPI out.
need "g++:g++:the C++ compiler"
has_mpi=no
if command -v mpirun >/dev/null; then has_mpi=yes; fi

# Line 1: every input that changes the binary (part of the cache key). Line 2: the engine installed
# now, a hash of its RECORD (which lists every installed file's hash), or "none".
facts=$("$PYTHON" - "$HOROVOD_VERSION" <<'EOF'
import hashlib, sys, sysconfig
from importlib.metadata import distribution, version, PackageNotFoundError
def v(name):
    try:
        return version(name)
    except PackageNotFoundError:
        return "missing"
torch, tf = v("torch"), v("tensorflow-cpu")
if tf == "missing":
    tf = v("tensorflow")
if torch == "missing":  # on stdout: the one line the script dies with (TensorFlow is optional)
    print(f"torch is not installed in {sys.executable}; Horovod compiles against it. Install it first: pip install "
          "torch tensorflow-cpu keras (TensorFlow is optional: torch alone gives a PyTorch-only engine; "
          "pip install 'hvdkit[torch,tensorflow]' for the tested pins)")
    sys.exit(3)
print(f"horovod={sys.argv[1]} torch={torch} tensorflow={tf} "
      f"python={sysconfig.get_config_var('SOABI')}")
try:
    print(hashlib.sha256((distribution("horovod").read_text("RECORD") or "").encode()).hexdigest()[:16])
except PackageNotFoundError:
    print("none")
EOF
) || die "${facts:-could not read the framework versions from $PYTHON (see above)}"
{ read -r inputs; read -r installed; } <<<"$facts"
has_tf=yes
[[ $inputs == *" tensorflow=missing "* ]] && has_tf=no
mpi_version=$(mpirun --version 2>/dev/null | head -n 1 || true)
# The variant and its settings (plan_variant, plan_key, plan_nccl_so, plan_settings, plan_notes).
plan=$("$PYTHON" "$here/engine_plan.py" --gpu "$GPU_MODE" --cuda-archs "$CUDA_ARCHS" --tensorflow "$has_tf" \
  --mpi "$has_mpi") || die "${plan:-engine_plan.py failed (see above)}"
eval "$plan"
gcc_version=$(g++ -dumpfullversion)
compgen -G "$here/horovod-build/0[1-9]-*.patch" >/dev/null \
  || die "no build patches in $here/horovod-build: this hvdkit's engine recipe is incomplete; reinstall hvdkit"
# The recipe is the block between the ">>> recipe" and "<<< recipe" lines (the flags) and the build
# patches every build applies (horovod-build/0N-*.patch, names and contents).
recipe_hash=$( (sed -n '/^    # >>> recipe/,/^    # <<< recipe/p' "$here/build-horovod.sh"
  for p in "$here"/horovod-build/0[1-9]-*.patch; do basename "$p"; cat "$p"; done) | sha256sum | cut -c1-16)
# The engine fixes: their level hashes every patch file; the applying script is an input too.
fix_level=$(bash "$here/apply-horovod-fixes.sh" --level) || die "could not compute the engine fix level"
fix_tool=$(sha256sum < "$here/apply-horovod-fixes.sh" | cut -c1-16)
variant_key=""  # the plain CPU build adds nothing: its key is the one it had before GPU builds
if [[ -n $plan_key ]]; then
  variant_key="|variant=$plan_key"
  if [[ $plan_variant == gpu ]]; then  # the GPU block, its build patches and the GPU-only fixes: GPU inputs
    gpu_recipe=$( (sed -n '/^    # >>> gpu recipe/,/^    # <<< gpu recipe/p' "$here/build-horovod.sh"
      for p in "$here"/horovod-build/1[0-9]-gpu-*.patch "$here"/horovod-fixes-gpu/*.patch; do
        basename "$p"; cat "$p"; done) | sha256sum | cut -c1-16)
    variant_key+="|gpu-recipe=$gpu_recipe"
  fi
fi
key=$(printf '%s|%s|gcc=%s|recipe=%s|fixes=%s|%s|sdist=%s%s' "$inputs" "$mpi_version" "$gcc_version" "$recipe_hash" \
  "$fix_level" "$fix_tool" "$sdist_sha256" "$variant_key" | sha256sum | cut -c1-20)
wheel_dir="$CACHE/horovod-$HOROVOD_VERSION-$key"
if [[ $mode == key ]]; then
  echo "$wheel_dir"
  exit 0
fi
base_settings=(HOROVOD_WITH_MPI=1 HOROVOD_WITH_GLOO=1 HOROVOD_WITH_PYTORCH=1 HOROVOD_WITH_TENSORFLOW=1
  HOROVOD_WITHOUT_MXNET=1)  # the CPU block's own (below); plan_settings are exported before it, WITHOUT_* win
if [[ $mode == dry-run ]]; then
  cached="not built yet (a build compiles from the sdist)"
  compgen -G "$wheel_dir/horovod-*.whl" >/dev/null && cached="cached: $(basename "$(ls "$wheel_dir"/horovod-*.whl | head -n 1)")"
  echo "Horovod $HOROVOD_VERSION engine plan for $PYTHON (dry run: nothing is built)"
  echo "  inputs:    $inputs | ${mpi_version:-no MPI} | gcc $gcc_version"
  echo "  variant:   $plan_variant ($([[ $plan_variant == gpu ]] && echo "NCCL for CUDA tensors, " )$([[ $has_mpi == yes ]] && echo "MPI and ")Gloo for CPU tensors)"
  for note in "${plan_notes[@]}"; do echo "  note:      $note"; done
  echo "  fixes:     $fix_level$([[ $plan_variant == gpu ]] && printf ' + GPU: %s' "$(cd "$here/horovod-fixes-gpu" && ls *.patch | tr '\n' ' ')")"
  echo "  settings:"
  for s in "${base_settings[@]}" "${plan_settings[@]}" MAKEFLAGS=-j"$JOBS"; do echo "    $s"; done
  if [[ $plan_variant == gpu ]]; then
    echo "    HOROVOD_NCCL_LIB=<build folder>/nccl-lib  (libnccl.so -> $plan_nccl_so)"
  fi
  echo "  wheel:     $wheel_dir ($cached)"
  exit 0
fi
say "inputs: $inputs | $mpi_version | gcc $gcc_version | recipe $recipe_hash | $fix_level${variant_key:+ | ${variant_key#|}}"
for note in "${plan_notes[@]}"; do say "$note"; done

site=$("$PYTHON" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
stamp="$site/.hvdkit-horovod-key"  # "<key> <installed engine>", written once check-build passed
if [[ -f $stamp && $(cat "$stamp") == "$key $installed" ]]; then
  say "Horovod $HOROVOD_VERSION already installed for key $key and checked (the engine is unchanged: no check-build)"
else
  wheel=$(ls "$wheel_dir"/horovod-*.whl 2>/dev/null | head -n 1 || true)
  if [[ -z $wheel ]]; then  # a build: everything it needs is there, or nothing is changed
    mpi_headers=()
    [[ $has_mpi == yes ]] && mpi_headers=("mpicc:libopenmpi-dev:the Open MPI headers")
    need "${mpi_headers[@]}" "cmake:cmake:the build system" "make:make:the build tool" "patch:patch:applies the engine fixes"
    include=$("$PYTHON" -c 'import sysconfig; print(sysconfig.get_paths()["include"])')
    [[ -f $include/Python.h ]] || die "no Python.h in $include: the Python headers are missing. Install them: apt-get install -y $(basename "$include")-dev"
    # Horovod's setup.py asks for cffi; missing, setuptools would try to download it (and fail offline).
    "$PYTHON" -c 'import cffi' 2>/dev/null || die "Horovod's build needs cffi in $PYTHON: $PYTHON -m pip install cffi"
  fi
  rm -f "$stamp"
  if [[ -z $wheel ]]; then
    say "no cached wheel for key $key: building from the sdist (about 6 minutes on 2 cores)"
    work=$(mktemp -d)
    trap 'rm -rf "$work"' EXIT
    if [[ -n ${HVDKIT_HOROVOD_SDIST:-} ]]; then  # a machine without a package index: the sdist brought along
      [[ -f $HVDKIT_HOROVOD_SDIST ]] || die "HVDKIT_HOROVOD_SDIST='$HVDKIT_HOROVOD_SDIST' is not a file; point it at horovod-$HOROVOD_VERSION.tar.gz"
      cp "$HVDKIT_HOROVOD_SDIST" "$work/horovod-$HOROVOD_VERSION.tar.gz"
    else
      "$PYTHON" -m pip download --quiet --no-deps --no-binary :all: -d "$work" "horovod==$HOROVOD_VERSION"
    fi
    got=$(sha256sum < "$work/horovod-$HOROVOD_VERSION.tar.gz" | cut -c1-64)
    [[ $got == "$sdist_sha256" ]] || die "the downloaded horovod-$HOROVOD_VERSION.tar.gz has SHA-256 $got, not the pinned $sdist_sha256: refusing to build it (check your package index, or set HOROVOD_SDIST_SHA256)"
    tar -xzf "$work"/horovod-"$HOROVOD_VERSION".tar.gz -C "$work"
    src="$work/horovod-$HOROVOD_VERSION"
    if [[ $plan_variant == gpu ]]; then
    # >>> gpu recipe
    # G1-G2. Build patches (horovod-build/): nvcc of CUDA >= 12.8 needs C++17 for its own headers (CCCL),
    # Horovod asks C++11 for its kernels; distutils is gone from Python 3.12: sysconfig names the headers.
    for p in 10-gpu-cuda-cxx17 11-gpu-torch-python-include-from-sysconfig; do
      patch -d "$src" -p1 --forward --batch --quiet < "$here/horovod-build/$p.patch" || die "build patch $p does not apply"
    done
    # G3. C++ fixes of the GPU code paths (horovod-fixes-gpu/*.patch, in name order).
    for p in "$here"/horovod-fixes-gpu/*.patch; do
      patch -d "$src" -p1 --forward --batch --quiet < "$p" || die "GPU engine fix $(basename "$p") does not apply"
    done
    # G4. NCCL: torch's own libnccl.so.2, linked through a libnccl.so the pip wheel lacks.
    mkdir -p "$work/nccl-lib"
    ln -sf "$plan_nccl_so" "$work/nccl-lib/libnccl.so"
    export HOROVOD_NCCL_LIB="$work/nccl-lib"
    # G5. PyPI's CUDA toolkit wheels (site-packages/nvidia/cu13) keep the libraries in lib/, where
    # nvcc.profile and CMake look in lib64/, and lack the unversioned libcudart.so: build against a view
    # of that tree laid out like /usr/local/cuda. nvcc reads the profile next to its real path, so the
    # view's bin/ holds hard links (or copies), not symbolic links.
    cuda_home=""
    for s in "${plan_settings[@]}"; do [[ $s == HOROVOD_CUDA_HOME=* ]] && cuda_home=${s#*=}; done
    if [[ -n $cuda_home && ! -e $cuda_home/lib64 && -d $cuda_home/lib ]]; then
      view="$work/cuda-home"
      mkdir -p "$view/lib64"
      cp -al "$cuda_home/bin" "$view/bin" 2>/dev/null || cp -a "$cuda_home/bin" "$view/bin"
      for d in "$cuda_home"/*; do case ${d##*/} in bin | lib) ;; *) ln -s "$d" "$view/" ;; esac; done
      ln -s "$cuda_home"/lib/* "$view/lib64/"
      for so in "$view"/lib64/lib*.so.[0-9]*; do [[ -e ${so%%.so.*}.so ]] || ln -s "${so##*/}" "${so%%.so.*}.so"; done
      ln -s lib64 "$view/lib"
      plan_settings=("${plan_settings[@]/#HOROVOD_CUDA_HOME=*/HOROVOD_CUDA_HOME=$view}")
      plan_settings=("${plan_settings[@]/#CUDA_HOME=*/CUDA_HOME=$view}")
      say "CUDA toolkit of pip wheels ($cuda_home): building against the view $view"
    fi
    # G6. torch >= 2.14's headers need C++20 (ATen.h: "C++20 or later compatible compiler is required"):
    # the torch binding (the one target that includes them) is compiled as C++20 where they say so.
    if grep -qs 'C++20 or later' "$site/torch/include/ATen/ATen.h"; then
      patch -d "$src" -p1 --forward --batch --quiet < "$here/horovod-build/12-gpu-torch-cxx20.patch" \
        || die "build patch 12-gpu-torch-cxx20 does not apply"
    fi
    # <<< gpu recipe
    fi
    for s in "${plan_settings[@]}"; do export "${s?}"; done  # the variant's settings; HOROVOD_WITHOUT_* win below
    # Newer build tools than Debian 12's (found building on Ubuntu 24.04; the gcc version is in the key,
    # and neither applies to the CPU recipe's Debian 12 tools, whose build is unchanged):
    # CMake >= 4 refuses projects asking for compatibility with CMake < 3.5 (Gloo's); this lets them
    # configure as 3.5 would.
    cmake_major=$(cmake --version | sed -n 's/^cmake version \([0-9]*\).*/\1/p')
    ((${cmake_major:-3} >= 4)) && export CMAKE_POLICY_VERSION_MINIMUM=${CMAKE_POLICY_VERSION_MINIMUM:-3.5}
    # g++ >= 13's standard headers no longer include <string>, <stdexcept>, ... from one another, and
    # Horovod's common.h and group_table.h relied on that: name them for every C++ file.
    if ((${gcc_version%%.*} >= 13)); then
      export CXXFLAGS="${CXXFLAGS:-} -include cstdint -include stdexcept -include string -include unordered_map -include vector"
    fi
    # >>> recipe
    # 1-2. Build patches (horovod-build/): torch and TensorFlow headers need C++17 (01); xla_mpi_ops.cc is
    # GPU-only code, on CPU it only fails on a missing highwayhash header (02).
    for p in "$here"/horovod-build/0[1-9]-*.patch; do
      patch -d "$src" -p1 --forward --batch --quiet < "$p" || die "build patch $(basename "$p" .patch) does not apply"
    done
    # 4. hvdkit's engine fixes (Python only), then the fix-level marker horovod/hvdkit_fixes.py.
    "$here/apply-horovod-fixes.sh" "$src" || die "an engine fix does not apply (named above)"
    mkdir -p "$wheel_dir"
    (
      cd "$src"
      HOROVOD_WITH_MPI=1 HOROVOD_WITH_GLOO=1 HOROVOD_WITH_PYTORCH=1 HOROVOD_WITH_TENSORFLOW=1 \
      HOROVOD_WITHOUT_MXNET=1 MAKEFLAGS=-j"$JOBS" \
        "$PYTHON" -m pip wheel --no-build-isolation --no-deps -w "$work/out" . >&2
    ) || die "the Horovod build failed (see the compiler output above)"
    # <<< recipe
    # A temporary name, then a rename: a copy cut short never looks like a cached wheel.
    built=$(ls "$work"/out/horovod-*.whl | head -n 1)
    cp "$built" "$wheel_dir/.partial-$$"
    mv -f "$wheel_dir/.partial-$$" "$wheel_dir/$(basename "$built")"
    wheel=$wheel_dir/$(basename "$built")
    say "cached $wheel"
  else
    say "using cached wheel $wheel"
  fi
  "$PYTHON" -m pip install --quiet --no-deps --force-reinstall "$wheel"

  # Fail loudly, naming what is missing, unless the engine has every part hvdkit needs; then stamp it.
  say "checking the engine: horovodrun --check-build (about 25 s; only when the engine changed)"
  bindir=$(dirname "$("$PYTHON" -c 'import sys; print(sys.executable)')")
  report=$("$bindir/horovodrun" --check-build 2>&1) || die "horovodrun --check-build failed: $report"
  parts=(PyTorch Gloo)
  [[ $has_tf == yes ]] && parts+=(TensorFlow)
  [[ $has_mpi == yes ]] && parts+=(MPI)
  [[ $plan_variant == gpu ]] && parts+=(NCCL)
  missing=()
  for part in "${parts[@]}"; do
    grep -q "\[X\] $part\$" <<<"$report" || missing+=("$part")
  done
  if ((${#missing[@]})); then
    die "Horovod was built without: ${missing[*]}. Check the build output for why, remove $wheel_dir and run again."
  fi
  grep -q "hvdkit engine fixes: $fix_level " <<<"$report" || {
    die "the installed Horovod does not carry fix level $fix_level (check-build says: $(grep 'hvdkit engine fixes' <<<"$report" || echo none)); remove $wheel_dir and run again"
  }
  installed=$("$PYTHON" -c 'import hashlib; from importlib.metadata import distribution as d; print(hashlib.sha256((d("horovod").read_text("RECORD") or "").encode()).hexdigest()[:16])')
  echo "$key $installed" > "$stamp"
fi
built_with="PyTorch"
[[ $has_tf == yes ]] && built_with+=", TensorFlow"
[[ $has_mpi == yes ]] && built_with+=", MPI"
built_with+=" and Gloo"
[[ $plan_variant == gpu ]] && built_with+="; NCCL for CUDA tensors"
say "ok: Horovod $HOROVOD_VERSION with $built_with; $fix_level"

#!/usr/bin/env bash
# Build (or reuse) the Horovod engine for the Python environment given by $PYTHON and install it.
#
#   build-horovod.sh          build or reuse the wheel, install it, check it
#   build-horovod.sh --key    print the wheel cache folder for $PYTHON (its name ends in the key); build nothing
#
# Horovod 0.28.1 from PyPI does not compile against torch >= 2.1 or TensorFlow >= 2.10 (their
# headers need C++17). The recipe patches the sdist in three places, applies hvdkit's engine fixes
# (horovod-fixes/*.patch next to this script, by apply-horovod-fixes.sh) and builds a wheel with MPI,
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
case ${1:-} in
  "") ;;
  --key) mode=key ;;
  *) die "unknown argument '$1'; usage: build-horovod.sh [--key]" ;;
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
# The key needs the MPI and compiler versions; a build needs more (checked on a cache miss).
need "mpirun:openmpi-bin:the Open MPI launcher" "g++:g++:the C++ compiler"

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
fix = "pip install torch tensorflow-cpu keras (or pip install 'hvdkit[torch,tensorflow]' for the tested pins)"
for name, found in (("torch", torch), ("tensorflow (or tensorflow-cpu)", tf)):
    if found == "missing":  # on stdout: the one line the script dies with
        print(f"{name} is not installed in {sys.executable}; Horovod compiles against it. Install it first: {fix}")
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
mpi_version=$(mpirun --version 2>/dev/null | head -n 1)
gcc_version=$(g++ -dumpfullversion)
# The recipe is the block between the ">>> recipe" and "<<< recipe" lines: the edits and the flags.
recipe_hash=$(sed -n '/^    # >>> recipe/,/^    # <<< recipe/p' "$here/build-horovod.sh" | sha256sum | cut -c1-16)
# The engine fixes: their level hashes every patch file; the applying script is an input too.
fix_level=$(bash "$here/apply-horovod-fixes.sh" --level) || die "could not compute the engine fix level"
fix_tool=$(sha256sum < "$here/apply-horovod-fixes.sh" | cut -c1-16)
key=$(printf '%s|%s|gcc=%s|recipe=%s|fixes=%s|%s|sdist=%s' "$inputs" "$mpi_version" "$gcc_version" "$recipe_hash" \
  "$fix_level" "$fix_tool" "$sdist_sha256" | sha256sum | cut -c1-20)
wheel_dir="$CACHE/horovod-$HOROVOD_VERSION-$key"
if [[ $mode == key ]]; then
  echo "$wheel_dir"
  exit 0
fi
say "inputs: $inputs | $mpi_version | gcc $gcc_version | recipe $recipe_hash | $fix_level"

site=$("$PYTHON" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
stamp="$site/.hvdkit-horovod-key"  # "<key> <installed engine>", written once check-build passed
if [[ -f $stamp && $(cat "$stamp") == "$key $installed" ]]; then
  say "Horovod $HOROVOD_VERSION already installed for key $key and checked (the engine is unchanged: no check-build)"
else
  wheel=$(ls "$wheel_dir"/horovod-*.whl 2>/dev/null | head -n 1 || true)
  if [[ -z $wheel ]]; then  # a build: everything it needs is there, or nothing is changed
    need "mpicc:libopenmpi-dev:the Open MPI headers" "cmake:cmake:the build system" "make:make:the build tool" \
      "patch:patch:applies the engine fixes"
    include=$("$PYTHON" -c 'import sysconfig; print(sysconfig.get_paths()["include"])')
    [[ -f $include/Python.h ]] || die "no Python.h in $include: the Python headers are missing. Install them: apt-get install -y $(basename "$include")-dev"
  fi
  rm -f "$stamp"
  if [[ -z $wheel ]]; then
    say "no cached wheel for key $key: building from the sdist (about 6 minutes on 2 cores)"
    work=$(mktemp -d)
    trap 'rm -rf "$work"' EXIT
    "$PYTHON" -m pip download --quiet --no-deps --no-binary :all: -d "$work" "horovod==$HOROVOD_VERSION"
    got=$(sha256sum < "$work/horovod-$HOROVOD_VERSION.tar.gz" | cut -c1-64)
    [[ $got == "$sdist_sha256" ]] || die "the downloaded horovod-$HOROVOD_VERSION.tar.gz has SHA-256 $got, not the pinned $sdist_sha256: refusing to build it (check your package index, or set HOROVOD_SDIST_SHA256)"
    tar -xzf "$work"/horovod-"$HOROVOD_VERSION".tar.gz -C "$work"
    src="$work/horovod-$HOROVOD_VERSION"
    # >>> recipe
    # 1-2. torch and TensorFlow headers need C++17.
    for f in CMakeLists.txt horovod/torch/CMakeLists.txt; do
      sed -i 's/set(CMAKE_CXX_STANDARD 14)/set(CMAKE_CXX_STANDARD 17)/' "$src/$f"
      grep -q 'set(CMAKE_CXX_STANDARD 17)' "$src/$f" || die "C++17 edit did not apply to $f"
    done
    # 3. xla_mpi_ops.cc is GPU-only code; on CPU it only fails on a missing highwayhash header.
    sed -i '/xla_mpi_ops\.cc/d' "$src/horovod/tensorflow/CMakeLists.txt"
    ! grep -q 'xla_mpi_ops' "$src/horovod/tensorflow/CMakeLists.txt" || die "xla_mpi_ops edit did not apply"
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
  missing=()
  for part in TensorFlow PyTorch MPI Gloo; do
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
say "ok: Horovod $HOROVOD_VERSION with TensorFlow, PyTorch, MPI and Gloo; $fix_level"

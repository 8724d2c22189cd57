#!/usr/bin/env bash
# Build (or reuse) the Horovod engine for the Python environment given by $PYTHON and install it.
#
# Horovod 0.28.1 from PyPI does not compile against torch >= 2.1 or TensorFlow >= 2.10 (their
# headers need C++17). The recipe (see DESIGN.md of the project) patches the sdist in three places,
# applies hvdkit's engine fixes (scripts/horovod-fixes/*.patch, by scripts/apply-horovod-fixes.sh)
# and builds a wheel with MPI, Gloo, PyTorch and TensorFlow. The wheel is cached outside the
# repository under a key made of every input (the fixes included), so a second run only reinstalls it.
#
# This one script is used by `make setup` and by docker/Dockerfile.
#
# Env:
#   PYTHON               interpreter of the target environment (default: python3)
#   HOROVOD_VERSION      sdist version to build (default: from constraints.txt, else 0.28.1)
#   HVDKIT_WHEEL_CACHE   wheel cache folder (default: ${XDG_CACHE_HOME:-~/.cache}/hvdkit/wheels)
#   HVDKIT_BUILD_JOBS    parallel compile jobs (default: number of cores)
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(dirname "$here")
PYTHON=${PYTHON:-python3}
if [[ -z ${HOROVOD_VERSION:-} ]]; then
  HOROVOD_VERSION=$(sed -n 's/^horovod==\([0-9.]*\).*/\1/p' "$root/constraints.txt" 2>/dev/null || true)
  HOROVOD_VERSION=${HOROVOD_VERSION:-0.28.1}
fi
CACHE=${HVDKIT_WHEEL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/hvdkit/wheels}
JOBS=${HVDKIT_BUILD_JOBS:-$(nproc)}

say() { printf '[build-horovod] %s\n' "$*" >&2; }
die() { printf '[build-horovod] ERROR: %s\n' "$*" >&2; exit 1; }

command -v "$PYTHON" >/dev/null || die "no interpreter '$PYTHON'; set PYTHON to the venv's python"
for tool in mpicc cmake g++ make patch; do
  command -v "$tool" >/dev/null || die "'$tool' is missing; install it (Debian: apt-get install libopenmpi-dev cmake g++ make patch)"
done

# Every input that changes the binary goes into the cache key.
inputs=$("$PYTHON" - "$HOROVOD_VERSION" <<'EOF'
import sys, sysconfig
from importlib.metadata import version, PackageNotFoundError
def v(name):
    try:
        return version(name)
    except PackageNotFoundError:
        return "missing"
torch, tf = v("torch"), v("tensorflow-cpu")
if tf == "missing":
    tf = v("tensorflow")
if "missing" in (torch, tf):
    sys.exit(f"torch={torch} tensorflow={tf}: install the frameworks before building Horovod (make setup does)")
print(f"horovod={sys.argv[1]} torch={torch} tensorflow={tf} "
      f"python={sysconfig.get_config_var('SOABI')}")
EOF
) || die "could not read framework versions from $PYTHON"
mpi_version=$(mpirun --version 2>/dev/null | head -n 1)
gcc_version=$(g++ -dumpfullversion)
# The recipe is the block between the ">>> recipe" and "<<< recipe" lines: the edits and the flags.
recipe_hash=$(sed -n '/^    # >>> recipe/,/^    # <<< recipe/p' "$here/build-horovod.sh" | sha256sum | cut -c1-16)
# The engine fixes: their level hashes every patch file; the applying script is an input too.
fix_level=$("$here/apply-horovod-fixes.sh" --level) || die "could not compute the engine fix level"
fix_tool=$(sha256sum < "$here/apply-horovod-fixes.sh" | cut -c1-16)
key=$(printf '%s|%s|gcc=%s|recipe=%s|fixes=%s|%s' "$inputs" "$mpi_version" "$gcc_version" "$recipe_hash" \
  "$fix_level" "$fix_tool" | sha256sum | cut -c1-20)
wheel_dir="$CACHE/horovod-$HOROVOD_VERSION-$key"
say "inputs: $inputs | $mpi_version | gcc $gcc_version | recipe $recipe_hash | $fix_level"

site=$("$PYTHON" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
stamp="$site/.hvdkit-horovod-key"
if [[ -f $stamp && $(cat "$stamp") == "$key" ]] && "$PYTHON" -c 'import horovod' 2>/dev/null; then
  say "Horovod $HOROVOD_VERSION already installed for key $key"
else
  wheel=$(ls "$wheel_dir"/horovod-*.whl 2>/dev/null | head -n 1 || true)
  if [[ -z $wheel ]]; then
    say "no cached wheel for key $key: building from the sdist (about 6 minutes on 2 cores)"
    work=$(mktemp -d)
    trap 'rm -rf "$work"' EXIT
    "$PYTHON" -m pip download --quiet --no-deps --no-binary :all: -d "$work" "horovod==$HOROVOD_VERSION"
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
    cp "$work"/out/horovod-*.whl "$wheel_dir"/
    wheel=$(ls "$wheel_dir"/horovod-*.whl | head -n 1)
    say "cached $wheel"
  else
    say "using cached wheel $wheel"
  fi
  "$PYTHON" -m pip install --quiet --no-deps --force-reinstall "$wheel"
  echo "$key" > "$stamp"
fi

# Fail loudly, naming what is missing, unless the engine has every part hvdkit needs.
bindir=$(dirname "$("$PYTHON" -c 'import sys; print(sys.executable)')")
report=$("$bindir/horovodrun" --check-build 2>&1) || die "horovodrun --check-build failed: $report"
missing=()
for part in TensorFlow PyTorch MPI Gloo; do
  grep -q "\[X\] $part\$" <<<"$report" || missing+=("$part")
done
if ((${#missing[@]})); then
  rm -f "$stamp"
  die "Horovod was built without: ${missing[*]}. Check the build output for why, remove $wheel_dir and run again."
fi
grep -q "hvdkit engine fixes: $fix_level " <<<"$report" || {
  rm -f "$stamp"
  die "the installed Horovod does not carry fix level $fix_level (check-build says: $(grep 'hvdkit engine fixes' <<<"$report" || echo none)); remove $wheel_dir and run again"
}
say "ok: Horovod $HOROVOD_VERSION with TensorFlow, PyTorch, MPI and Gloo; $fix_level"

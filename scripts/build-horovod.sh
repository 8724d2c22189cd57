#!/usr/bin/env bash
# The Horovod engine for `make setup` and docker/Dockerfile: build (or reuse) it and install it into
# the environment of $PYTHON. The recipe, the engine fixes and the wheel cache key live in the hvdkit
# package (hvdkit/engine/recipe/build-horovod.sh), so that `hvdkit engine install` runs the same
# recipe in any environment; this wrapper only adds constraints.txt's Horovod pin.
#
# Env: as hvdkit/engine/recipe/build-horovod.sh (PYTHON, HOROVOD_VERSION, HVDKIT_WHEEL_CACHE,
# HVDKIT_BUILD_JOBS).
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
if [[ -z ${HOROVOD_VERSION:-} && -f $root/constraints.txt ]]; then
  HOROVOD_VERSION=$(sed -n 's/^horovod==\([0-9.]*\).*/\1/p' "$root/constraints.txt")
fi
export HOROVOD_VERSION=${HOROVOD_VERSION:-}  # empty: the recipe's own default
exec bash "$root/hvdkit/engine/recipe/build-horovod.sh" "$@"

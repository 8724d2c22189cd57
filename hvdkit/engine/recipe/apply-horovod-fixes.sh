#!/usr/bin/env bash
# Apply hvdkit's engine fixes to an extracted Horovod sdist and mark the fix level in it.
#
#   scripts/apply-horovod-fixes.sh SRC_DIR     apply every scripts/horovod-fixes/*.patch in name
#                                              order, then write SRC_DIR/horovod/hvdkit_fixes.py
#   scripts/apply-horovod-fixes.sh --level     print the fix level only (it names the patch set)
#
# Each patch is a unified diff against the pristine sdist root (paths a/horovod/... b/horovod/...)
# applied with `patch -p1 --forward --batch`; one that does not apply stops everything, named.
# The level is "hvdkit-fixes-<12 hex>", a hash of every patch file's name and content, so the wheel
# cache key (scripts/build-horovod.sh) and the installed marker change whenever a fix does.
# `horovodrun --check-build` and `hvdkit doctor` print it (fix 01).
#
# Env:
#   HVDKIT_HOROVOD_FIXES   folder of the patches (default: scripts/horovod-fixes next to this script)
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
FIXES=${HVDKIT_HOROVOD_FIXES:-$here/horovod-fixes}

die() { printf '[apply-horovod-fixes] ERROR: %s\n' "$*" >&2; exit 1; }
say() { printf '[apply-horovod-fixes] %s\n' "$*" >&2; }

shopt -s nullglob

fix_level() {
  local digest
  digest=$(for p in "${patches[@]}"; do basename "$p"; cat "$p"; done | sha256sum | cut -c1-12)
  printf 'hvdkit-fixes-%s\n' "$digest"
}

[[ $# -eq 1 ]] || die "usage: $0 SRC_DIR | --level"
export LC_COLLATE=C
patches=("$FIXES"/*.patch)  # glob order is name order under LC_COLLATE=C
if [[ $1 == --level ]]; then
  fix_level
  exit 0
fi

src=$1
[[ -d $src/horovod ]] || die "'$src' is not an extracted Horovod sdist (no horovod/ folder in it)"
command -v patch >/dev/null || die "'patch' is missing; install it (Debian: apt-get install patch)"
names=()
for p in "${patches[@]}"; do
  name=$(basename "$p" .patch)
  out=$(cd "$src" && patch -p1 --forward --batch --no-backup-if-mismatch --reject-file=- < "$p" 2>&1) \
    || die "fix $name does not apply to $src:"$'\n'"$out"$'\n'"Rebase $p on the pristine sdist (see scripts/horovod-fixes/README.md)."
  names+=("$name")
  say "applied $name"
done
level=$(fix_level)
{
  printf '"""The hvdkit engine fixes this Horovod build carries (written by scripts/apply-horovod-fixes.sh)."""\n\n'
  printf 'LEVEL = "%s"\n' "$level"
  printf 'FIXES = (\n'
  for n in "${names[@]}"; do printf '    "%s",\n' "$n"; done
  printf ')\n'
} > "$src/horovod/hvdkit_fixes.py"
say "fix level $level (${#names[@]} fixes)"

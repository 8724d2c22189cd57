#!/bin/bash
# Entrypoint of the hvdkit image (/usr/local/bin/hvdkit-entrypoint): per-container ssh state, then
# `exec "$@"` (the command keeps this process, its signals and its exit code).
#
# 1. A host key for sshd, made now: the image holds none, so no two containers share one and no
#    one who pulls the image knows it. Kept while the container lives (a restart reuses it).
# 2. The MPI Operator's key Secret, mounted at $HVDKIT_SSH_SECRET (root's files, mode 0644 in a
#    Secret volume), copied into ~/.ssh (0700) as the user's own files: id_rsa 0600,
#    authorized_keys 0600, id_rsa.pub 0644. ssh, mpirun and sshd (StrictModes yes) read only these.
# A failure here is reported and the command still runs: only sshd and ssh need this state, and
# they fail with their own message without it.
#
# Env:
#   HOME               where ~/.ssh is (the image's user: /home/hvdkit)
#   HVDKIT_SSH_SECRET  folder with the operator's id_rsa, id_rsa.pub, authorized_keys
#                      (default /home/hvdkit/.mpi-operator/ssh, the MPIJob's sshAuthMountPath)
set -uo pipefail

secret=${HVDKIT_SSH_SECRET:-/home/hvdkit/.mpi-operator/ssh}

warn() { printf 'hvdkit-entrypoint: %s\n' "$*" >&2; }

# Copy $1 from the Secret into ~/.ssh with mode $2, when the Secret has it.
copy_key() {
  [[ -e $secret/$1 ]] || return 0
  install -m "$2" "$secret/$1" "$ssh_dir/$1.new" && mv -f "$ssh_dir/$1.new" "$ssh_dir/$1"
}

setup_ssh() {
  [[ -n ${HOME:-} ]] || { warn "HOME is not set: no ~/.ssh to prepare"; return 1; }
  ssh_dir=$HOME/.ssh
  umask 077
  mkdir -p "$ssh_dir" && chmod 0700 "$ssh_dir" || return 1
  if [[ -d $secret ]]; then
    copy_key id_rsa 0600 && copy_key authorized_keys 0600 && copy_key id_rsa.pub 0644 || return 1
  fi
  local key=$ssh_dir/ssh_host_ed25519_key
  if [[ ! -s $key ]]; then
    rm -f "$key" "$key.pub"
    ssh-keygen -q -t ed25519 -N '' -C "hvdkit host key ${HOSTNAME:-}" -f "$key" </dev/null || return 1
  fi
}

if ! (setup_ssh); then
  warn "could not prepare ~/.ssh (HOME=${HOME:-}); sshd and ssh to other pods will fail, the command still runs"
fi
if (($# == 0)); then
  warn "no command given; e.g. hvdkit-entrypoint hvdkit run -np 2 -- python train.py"
  exit 2
fi
exec "$@"

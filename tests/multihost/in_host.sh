#!/bin/sh
# Run a command as if on test host NAME: own hostname (UTS namespace) and the test's ssh client
# settings over ~/.ssh (private mount namespace). Started by `ip netns exec NS unshare -m -u`.
#   in_host.sh NAME SSH_DIR -- COMMAND [ARGS...]
set -e
name=$1; ssh_dir=$2; shift 2
[ "$1" = "--" ] && shift
hostname "$name"
mount --bind "$ssh_dir" "$HOME/.ssh"
exec "$@"

#!/bin/sh
# Run a command as if on test host NAME: own hostname (UTS namespace) and the test's ssh client
# settings over ~/.ssh (private mount namespace); with --private-tmp also an empty /tmp of its own.
# Started by `ip netns exec NS unshare -m -u`.
#   in_host.sh NAME SSH_DIR [--private-tmp] -- COMMAND [ARGS...]
set -e
name=$1; ssh_dir=$2; shift 2
hostname "$name"
mount --bind "$ssh_dir" "$HOME/.ssh"
if [ "$1" = "--private-tmp" ]; then
  shift
  mount -t tmpfs -o mode=1777 hvdkit-tmp /tmp
fi
[ "$1" = "--" ] && shift
exec "$@"

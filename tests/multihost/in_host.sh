#!/bin/sh
# Run a command as if on test host NAME: own hostname (UTS namespace) and the test's ssh client
# settings over ~/.ssh (private mount namespace); with --private-tmp KEEP also an empty /tmp of its
# own, KEEP (the checkout) staying visible (private_tmp.sh). Started by `ip netns exec NS unshare -m -u`.
#   in_host.sh NAME SSH_DIR [--private-tmp KEEP] -- COMMAND [ARGS...]
set -e
name=$1; ssh_dir=$2; shift 2
hostname "$name"
mkdir -p -m 700 "$HOME/.ssh"  # another run's hosts may have removed it meanwhile
mount --bind "$ssh_dir" "$HOME/.ssh"
if [ "$1" = "--private-tmp" ]; then
  keep=$2; shift 2
  [ "$1" = "--" ] && shift
  exec "$(dirname "$0")/private_tmp.sh" "$keep" -- "$@"
fi
[ "$1" = "--" ] && shift
exec "$@"

#!/bin/sh
# Give this mount namespace an empty /tmp of its own, as a separate machine has, while KEEP (the
# checkout with its virtualenv, which may itself lie under /tmp) stays visible at the same path.
# Then exec COMMAND. Run it in a private mount namespace (unshare -m).
#   private_tmp.sh KEEP -- COMMAND [ARGS...]
set -e
keep=$1; shift
[ "$1" = "--" ] && shift
old=$(mktemp -d /run/hvdkit-oldtmp.XXXXXX)
mount --bind /tmp "$old"
mount -t tmpfs -o mode=1777 hvdkit-tmp /tmp
case $keep in
  /tmp/*)
    rel=${keep#/tmp/}
    mkdir -p "/tmp/$rel"
    mount --bind "$old/$rel" "/tmp/$rel"
    ;;
esac
umount "$old"
rmdir "$old"
exec "$@"

"""Write the runc config (OCI runtime spec) for one host of docker/two-hosts.sh to stdout.

Reads ``buildah inspect --type image`` JSON on stdin and takes from it what a container engine
would: the user, the working folder, the environment and the entrypoint. The host gets its own PID,
IPC, UTS (hostname) and mount namespaces, the network namespace given (made by ``ip netns add``),
/etc/hosts listing every host, and the operator-style key Secret mounted read-only where the
MPIJob mounts it. The command after ``--`` runs through the image's entrypoint, as the MPIJob's
``args`` do.
"""

import argparse
import json
import sys
from pathlib import Path

# What Docker and Kubernetes give a container by default, no more (sshd runs unprivileged on 2222).
CAPABILITIES = ["CAP_AUDIT_WRITE", "CAP_KILL", "CAP_NET_BIND_SERVICE"]
SHM_SIZE = "1g"  # Open MPI's shared-memory transport lives in /dev/shm


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rootfs", required=True, help="the container's root file system (buildah mount)")
    p.add_argument("--netns", required=True, help="path of the host's network namespace")
    p.add_argument("--hostname", required=True)
    p.add_argument("--hosts", required=True, help="file mounted as /etc/hosts")
    p.add_argument("--secret", required=True, help="folder with the operator's keys")
    p.add_argument("--secret-mount", required=True, help="where the MPIJob mounts them (sshAuthMountPath)")
    p.add_argument("command", nargs=argparse.REMAINDER, help="the container's args, after '--'")
    args = p.parse_args(argv)
    if args.command[:1] == ["--"]:
        args.command = args.command[1:]
    if not args.command:
        p.error("give the container's command after '--'")
    return args


def user_ids(rootfs, user):
    """``(uid, gid, home)`` of the image's USER (``uid:gid`` or a name) from the image's /etc/passwd."""
    name, _, group = (user or "0").partition(":")
    for line in (Path(rootfs) / "etc" / "passwd").read_text().splitlines():
        fields = line.split(":")
        if name in (fields[0], fields[2]):
            return int(fields[2]), int(group or fields[3]), fields[5]
    if name.isdigit():
        return int(name), int(group or name), "/"
    sys.exit(f"oci_config: the image's user {user!r} is not in its /etc/passwd")


def mounts(args):
    bind_ro = ["rbind", "ro", "nosuid", "nodev"]
    return [
        {"destination": "/proc", "type": "proc", "source": "proc"},
        {
            "destination": "/dev",
            "type": "tmpfs",
            "source": "tmpfs",
            "options": ["nosuid", "strictatime", "mode=755", "size=65536k"],
        },
        {
            "destination": "/dev/pts",
            "type": "devpts",
            "source": "devpts",
            "options": ["nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620"],
        },
        {
            "destination": "/dev/shm",
            "type": "tmpfs",
            "source": "shm",
            "options": ["nosuid", "noexec", "nodev", "mode=1777", f"size={SHM_SIZE}"],
        },
        {"destination": "/dev/mqueue", "type": "mqueue", "source": "mqueue", "options": ["nosuid", "noexec", "nodev"]},
        {"destination": "/sys", "type": "sysfs", "source": "sysfs", "options": ["nosuid", "noexec", "nodev", "ro"]},
        {"destination": "/tmp", "type": "tmpfs", "source": "tmpfs", "options": ["nosuid", "nodev", "mode=1777"]},
        {"destination": "/etc/hosts", "type": "bind", "source": args.hosts, "options": bind_ro},
        {"destination": args.secret_mount, "type": "bind", "source": args.secret, "options": bind_ro},
    ]


def config(image, args):
    oci = image["OCIv1"]["config"]
    uid, gid, home = user_ids(args.rootfs, oci.get("User"))
    env = [e for e in oci.get("Env", []) if not e.startswith(("HOME=", "HOSTNAME="))]
    env += [f"HOME={home}", f"HOSTNAME={args.hostname}"]
    caps = {kind: CAPABILITIES for kind in ("bounding", "effective", "permitted")}
    return {
        "ociVersion": "1.0.2",
        "process": {
            "terminal": False,
            "user": {"uid": uid, "gid": gid},
            "args": list(oci.get("Entrypoint") or []) + args.command,
            "env": env,
            "cwd": oci.get("WorkingDir") or "/",
            "capabilities": caps,
            "noNewPrivileges": True,
        },
        "root": {"path": args.rootfs, "readonly": False},
        "hostname": args.hostname,
        "mounts": mounts(args),
        "linux": {
            "namespaces": [
                {"type": "pid"},
                {"type": "ipc"},
                {"type": "uts"},
                {"type": "mount"},
                {"type": "network", "path": args.netns},
            ],
            "maskedPaths": ["/proc/kcore", "/proc/keys", "/proc/timer_list", "/sys/firmware"],
            "readonlyPaths": ["/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger"],
        },
    }


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    json.dump(config(json.load(sys.stdin), args), sys.stdout, indent=1)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()

"""A real SLURM cluster on this machine: slurmctld and two slurmd nodes on the two test hosts.

Built on ``netns.TwoHosts``: host a runs the controller and node a, host b runs node b, each node
with its own address and hostname (``slurmd -N NAME``). One ``munged`` with a fresh key serves both
(its socket is a file, which every network namespace reaches; ``AuthInfo=socket=...`` points the
SLURM daemons and tools at it). Everything lives in a temporary folder: configuration, key, state,
spool, logs. ``close()`` stops every daemon this module started, by pid, also after a failure;
jobs' processes die with the namespaces (``TwoHosts.close``).
Needs root and Debian's ``slurm-wlm`` and ``munge`` packages (``scripts/setup.sh`` installs them).
"""

import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import pytest
from netns import PRIVATE_TMP, ROOT, TwoHosts

BINARIES = ("munged", "slurmctld", "slurmd", "sbatch", "srun", "scontrol", "scancel", "squeue")
KILL_WAIT = 30  # seconds SLURM waits between SIGTERM and SIGKILL when it ends a job's steps


def missing_binaries():
    """The SLURM/munge programs this machine lacks (empty when the cluster can start)."""
    return [b for b in BINARIES if not (shutil.which(b) or os.path.exists(f"/usr/sbin/{b}"))]


OPT_IN = "HVDKIT_TEST_SLURM"
# What a test module that runs jobs on the test cluster needs (its pytestmark). About 4 minutes on 2
# quiet cores (each job starts torch and Horovod on two nodes): more than `make test` should add, so
# these run with `make slurm-test`.
NEEDS_SLURM = [
    pytest.mark.dist,
    pytest.mark.skipif(os.geteuid() != 0, reason="network namespaces, mounts and SLURM daemons need root"),
    pytest.mark.skipif(
        bool(missing_binaries()),
        reason=f"needs {', '.join(missing_binaries())} (Debian: slurm-wlm munge; make setup installs them)",
    ),
    pytest.mark.skipif(os.environ.get(OPT_IN) != "1", reason=f"opt-in, a few minutes: make slurm-test (or {OPT_IN}=1)"),
]


def _tool(name):
    return shutil.which(name) or f"/usr/sbin/{name}"


class SlurmCluster:
    """Controller on host a, nodes ``self.nodes`` (a, b); run SLURM commands with ``on_host``."""

    def __init__(self):
        self.hosts = TwoHosts(private_tmp=True)  # each node its own /tmp (Slurm's PMIx keeps per-step folders there)
        self.nodes = self.hosts.names
        self.dir = Path(tempfile.mkdtemp(prefix="hvdkit-slurm-", dir="/var/tmp"))
        self.conf = self.dir / "slurm.conf"
        self.socket = self.dir / "munge" / "munge.socket"
        self.env = {"SLURM_CONF": str(self.conf)}  # what every SLURM tool (and the jobs) read
        self._daemons = []  # Popen of every daemon, in start order

    def open(self):
        try:
            self.hosts.open()
            self._munge()
            self._write_conf()
            self._start(0, [_tool("slurmctld"), "-D", "-f", str(self.conf)], "slurmctld")
            for i, node in enumerate(self.nodes):
                self._start(i, [_tool("slurmd"), "-D", "-f", str(self.conf), "-N", node], f"slurmd-{node}")
            self._wait_idle()
        except BaseException:
            self.close()
            raise
        return self

    def _munge(self):
        (self.dir / "munge").mkdir(mode=0o700)
        key = self.dir / "munge" / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o600)
        argv = [
            _tool("munged"),
            "--foreground",
            "--force",
            f"--key-file={key}",
            f"--socket={self.socket}",
            f"--pid-file={self.dir / 'munge' / 'munged.pid'}",
            f"--log-file={self.dir / 'munged.log'}",
            f"--seed-file={self.dir / 'munge' / 'munged.seed'}",
        ]
        log = open(self.dir / "munged.out", "w")
        self._daemons.append(subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL))
        log.close()
        self._wait(lambda: self.socket.exists(), "munged did not create its socket", self.dir / "munged.log")

    def _write_conf(self):
        d = self.dir
        for sub in ("state", *(f"spool-{n}" for n in self.nodes)):
            (d / sub).mkdir()
        a, addr = self.nodes[0], self.hosts.addresses[0]
        lines = [
            f"ClusterName=hvdkit{os.getpid() % 10000}",
            f"SlurmctldHost={a}({addr})",
            "SlurmUser=root",
            "SlurmdUser=root",
            "AuthType=auth/munge",
            "CredType=cred/munge",
            f"AuthInfo=socket={self.socket}",
            f"StateSaveLocation={d / 'state'}",
            f"SlurmdSpoolDir={d}/spool-%n",
            f"SlurmctldPidFile={d / 'slurmctld.pid'}",
            f"SlurmdPidFile={d}/slurmd-%n.pid",
            f"SlurmctldLogFile={d / 'slurmctld.log'}",
            f"SlurmdLogFile={d}/slurmd-%n.log",
            "SlurmctldDebug=info",
            "SlurmdDebug=info",
            "ProctrackType=proctrack/linuxproc",  # no cgroups needed
            "TaskPlugin=task/none",
            "JobAcctGatherType=jobacct_gather/none",
            "AccountingStorageType=accounting_storage/none",
            "JobCompType=jobcomp/none",
            "SwitchType=switch/none",
            "MpiDefault=none",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_CPU",
            "SchedulerType=sched/backfill",
            "SlurmdParameters=config_overrides",  # both nodes share this machine's cores
            "ReturnToService=2",
            f"KillWait={KILL_WAIT}",
            "MinJobAge=600",  # finished jobs stay visible to scontrol for the asserts
            "MailProg=/bin/true",
            f"PlugStackConfig={d / 'plugstack.conf'}",
        ]
        for node, address in zip(self.nodes, self.hosts.addresses):
            lines.append(
                f"NodeName={node} NodeAddr={address} CPUs=2 Sockets=1 CoresPerSocket=2 ThreadsPerCore=1 "
                "RealMemory=4096 State=UNKNOWN"
            )
        lines.append(f"PartitionName=test Nodes={','.join(self.nodes)} Default=YES MaxTime=INFINITE State=UP")
        (d / "plugstack.conf").write_text("")
        (d / "cgroup.conf").write_text("CgroupPlugin=cgroup/v1\n")
        self.conf.write_text("\n".join(lines) + "\n")

    def _start(self, i, argv, name):
        log = open(self.dir / f"{name}.out", "w")
        env = dict(os.environ, **self.env)
        proc = subprocess.Popen(
            self.argv_on(i, argv), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env
        )
        log.close()
        self._daemons.append(proc)
        time.sleep(0.2)
        if proc.poll() is not None:
            raise RuntimeError(f"{name} exited at once:\n{self.logs(name)}")

    def _wait(self, ready, what, log, timeout=30):
        deadline = time.monotonic() + timeout
        while not ready():
            if time.monotonic() > deadline:
                raise RuntimeError(f"{what} within {timeout} s:\n{Path(log).read_text() if Path(log).exists() else ''}")
            time.sleep(0.1)

    def _wait_idle(self, timeout=60):
        def idle():
            p = self.run(0, ["sinfo", "-h", "-N", "-o", "%N %t"], check=False)
            states = dict(line.split() for line in p.stdout.splitlines() if len(line.split()) == 2)
            return all(states.get(n) == "idle" for n in self.nodes)

        self._wait(idle, "both nodes were not idle", self.dir / "slurmctld.log", timeout)

    def argv_on(self, i, argv):
        """``argv`` run on host i (0 = a, 1 = b): its address, hostname and own /tmp, and no ssh keys.

        Nothing started here can ssh to the other host: jobs reach it through SLURM only, as on a
        cluster whose compute nodes refuse ssh.
        """
        ns, name = self.hosts.ns[i], self.hosts.names[i]
        return [
            "ip",
            "netns",
            "exec",
            ns,
            "unshare",
            "-m",
            "-u",
            "sh",
            "-c",
            'hostname "$0" && shift && exec "$@"',
            name,
            "--",
            str(PRIVATE_TMP),
            str(ROOT),
            "--",
            *argv,
        ]

    def run(self, i, argv, check=True, timeout=60, env=None):
        """Run a short SLURM command on host i and return the CompletedProcess."""
        full = dict(os.environ, **self.env, **(env or {}))
        p = subprocess.run(
            self.argv_on(i, argv), capture_output=True, text=True, timeout=timeout, env=full, stdin=subprocess.DEVNULL
        )
        if check and p.returncode != 0:
            raise RuntimeError(f"{argv} failed ({p.returncode}): {p.stdout}{p.stderr}")
        return p

    def folder(self, name):
        """A new folder both nodes see at the same path (as a cluster's shared file system)."""
        path = self.dir / "work" / name
        path.mkdir(parents=True)
        return path

    def job(self, job_id):
        """``scontrol show job`` as a dict of its KEY=VALUE words."""
        out = self.run(0, ["scontrol", "-o", "show", "job", str(job_id)]).stdout
        return dict(w.split("=", 1) for w in out.split() if "=" in w)

    def wait_job(self, job_id, states, timeout=300):
        """Wait until the job's state is one of ``states``; return its ``job`` dict."""
        deadline = time.monotonic() + timeout
        while True:
            info = self.job(job_id)
            if info.get("JobState") in states:
                return info
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"job {job_id} is {info.get('JobState')}, not {states}, after {timeout} s:\n{self.logs()}"
                )
            time.sleep(0.5)

    def logs(self, *names):
        """The daemons' log files, for failure messages."""
        files = [self.dir / f"{n}.log" for n in names] if names else sorted(self.dir.glob("*.log"))
        return "\n".join(f"--- {f.name}\n{f.read_text()[-3000:]}" for f in files if f.exists())

    def close(self):
        for proc in reversed(self._daemons):
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 15
        for proc in reversed(self._daemons):
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self.hosts.close()  # also ends whatever a job left in the namespaces
        shutil.rmtree(self.dir, ignore_errors=True)

    def leftovers(self):
        """What of the cluster still exists (empty after ``close()``)."""
        found = [f"pid {p.pid}" for p in self._daemons if p.poll() is None]
        found += self.hosts.leftovers()
        return found + ([str(self.dir)] if self.dir.exists() else [])

"""Cluster files from one job description: SLURM batch script, MPIJob, mpirun/horovodrun scripts, hostfile.

Pure: ``render`` returns text. ``save`` and ``main`` (``python -m hvdkit.launch.render [DIR]``, which
rewrites the examples in the top-level ``launch/`` folder) are the only parts that write files.
"""

import dataclasses
import os
import re
import shlex
import sys
from dataclasses import dataclass

from ..core.errors import ConfigError
from ..core.options import check_positive_int
from . import plan as _plan
from .hosts import Host, check_slots, format_hosts, total_slots
from .spec import JobSpec

__all__ = [
    "RenderSpec",
    "TARGETS",
    "EXAMPLE",
    "EXAMPLE_FILES",
    "EXAMPLE_ELASTIC",
    "render",
    "render_command",
    "example_files",
    "save",
    "main",
]

TARGETS = ("slurm", "mpijob", "mpirun", "horovodrun", "hostfile")
SSH_HOME = "/home/hvdkit"  # the image runs as user hvdkit
# The MPI Operator (v2) mounts this script on the launcher; it prints `host:slots` for the running workers.
MPI_OPERATOR_DISCOVERY = "/etc/mpi/discover_hosts.sh"
# Where the MPI Operator mounts its key Secret: a folder only hvdkit can enter; the image's entrypoint
# (docker/entrypoint.sh) copies the keys into ~/.ssh with private modes at container start.
SSH_SECRET = f"{SSH_HOME}/.mpi-operator/ssh"
# The environment a rendered script is assumed to start in: only PATH among the variables that
# mpirun forwards, so the line never depends on the machine that rendered it.
SCRIPT_ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin"}

# Whole-string matches only (fullmatch): `$` would also match before a trailing newline.
_NAME = re.compile(r"[a-z0-9]([-a-z0-9]{0,48}[a-z0-9])?")  # a Kubernetes name that leaves room for suffixes
_MEMORY = re.compile(r"([1-9][0-9]{0,8})(Mi|Gi|Ti)")
_IMAGE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._/:@-]{0,254}")  # registry/path/name:tag@digest
_ESCAPES = {"\n": "\\n", "\t": "\\t", "\r": "\\r", "\\": "\\\\", "'": "\\'"}


def _default(value, fallback):
    return fallback if value is None else value


def _count(value, flag):
    return check_positive_int(flag, value)


@dataclass(frozen=True)
class RenderSpec:
    """One job: ``num_proc`` ranks of ``command`` on ``nodes`` machines, ``slots_per_node`` ranks on each.

    ``cpu`` (whole CPUs, default one per slot) and ``memory`` (``512Mi``, ``4Gi``) are per worker node.
    ``hosts`` (tuple of ``Host``) name the machines for the mpirun/horovodrun scripts; without them
    the scripts use placeholders ``node1:S`` .. ``nodeN:S``. Unset counts follow from the others.
    """

    command: tuple
    num_proc: int | None = None
    nodes: int | None = None
    slots_per_node: int | None = None
    image: str = "hvdkit:cpu"
    name: str = "hvdkit-job"
    cpu: int | None = None
    memory: str = "2Gi"
    hosts: tuple = ()
    min_np: int | None = None  # elastic (slurm, mpijob): the fewest ranks to train with
    max_np: int | None = None  # and the most to grow to

    def __post_init__(self):
        def fill(name, value):
            object.__setattr__(self, name, value)

        fill("command", tuple(self.command))
        fill("hosts", tuple(self.hosts))
        if not self.command or not all(isinstance(a, str) and a for a in self.command):
            raise ConfigError(
                f"command must be a non-empty list of words (got {list(self.command)!r}); put it after '--', "
                "e.g. hvdkit render slurm -- python train.py"
            )
        for word in self.command:
            _check_word(word)
        if not all(isinstance(h, Host) for h in self.hosts):
            raise ConfigError(f"hosts must be Host(name, slots) values (got {self.hosts!r})")
        most = max([h.slots for h in self.hosts] or [1])
        fill("nodes", _count(_default(self.nodes, len(self.hosts) or 1), "--nodes"))
        fill("slots_per_node", _count(_default(self.slots_per_node, most), "--slots-per-node"))
        capacity = self.nodes * self.slots_per_node
        fill("num_proc", _count(_default(self.num_proc, total_slots(self.hosts) or capacity), "-np/--num-proc"))
        if self.num_proc > capacity:
            raise ConfigError(
                f"-np {self.num_proc} does not fit {self.nodes} node(s) x {self.slots_per_node} slot(s) = {capacity}; "
                f"lower -np or raise --nodes/--slots-per-node"
            )
        check_slots(self.hosts, self.num_proc, origin=f"-H {format_hosts(self.hosts)}")
        _check_elastic(self)
        fill("cpu", _count(_default(self.cpu, self.slots_per_node), "--cpu"))
        if self.cpu < self.slots_per_node:
            raise ConfigError(
                f"--cpu {self.cpu} per worker is fewer than its {self.slots_per_node} slots; give each rank a CPU "
                f"(--cpu {self.slots_per_node}) or lower --slots-per-node"
            )
        if not isinstance(self.name, str) or not _NAME.fullmatch(self.name):
            raise ConfigError(
                f"--name {self.name!r} must be lowercase letters, digits and '-', at most 50, e.g. hvdkit-digits"
            )
        if not isinstance(self.memory, str) or not _MEMORY.fullmatch(self.memory):
            raise ConfigError(f"--memory {self.memory!r} must be a whole number of Mi, Gi or Ti, e.g. 4Gi")
        if not isinstance(self.image, str) or not _IMAGE.fullmatch(self.image):
            raise ConfigError(
                f"--image {self.image!r} must be an image reference (letters, digits and ._/:@-), e.g. hvdkit:cpu"
            )

    @property
    def elastic(self):
        return self.min_np is not None or self.max_np is not None

    @property
    def elastic_flags(self):
        """``--min-np MIN --max-np MAX`` for ``hvdkit run`` (empty when the job is not elastic)."""
        if not self.elastic:
            return []
        return ["--min-np", str(_default(self.min_np, self.num_proc)), "--max-np", str(_default(self.max_np, self.num_proc))]

    @property
    def launch_hosts(self):
        """The hosts the mpirun/horovodrun scripts name: the given ones, else placeholders."""
        return self.hosts or tuple(Host(f"node{i}", self.slots_per_node) for i in range(1, self.nodes + 1))


def _check_elastic(spec):
    """Raise ConfigError unless 1 <= --min-np <= -np <= --max-np (when either is given)."""
    lo = _count(_default(spec.min_np, spec.num_proc), "--min-np")
    hi = _count(_default(spec.max_np, spec.num_proc), "--max-np")
    if not lo <= spec.num_proc <= hi:
        raise ConfigError(f"elastic bounds need --min-np <= -np <= --max-np (got {lo} <= {spec.num_proc} <= {hi}); fix the one out of order")


def _check_word(word):
    """Raise ConfigError for a command word no rendered file can carry: NUL, or bytes that are not UTF-8."""
    if "\0" in word:
        raise ConfigError(
            f"command word {word!r} holds a NUL character, which no command line can carry; remove it "
            "(pass binary data through a file)"
        )
    if any("\ud800" <= c <= "\udfff" for c in word):
        raise ConfigError(
            f"command word {word!r} holds bytes that are not UTF-8 (a file name in another encoding?); "
            "rendered files are UTF-8 text: rename the file or pass its name through a variable"
        )


def _word(word):
    """``word`` quoted for bash, on one line.

    Printable words get ``shlex.quote``; a word with a newline, tab, control or line-separator
    character becomes ANSI-C ``$'...'`` with those characters escaped (as UTF-8 bytes), so that no
    rendered line, and no ``#`` comment or ``#SBATCH`` block, can end inside it.
    """
    if word.isprintable():
        return shlex.quote(word)
    parts = []
    for ch in word:
        if ch in _ESCAPES:
            parts.append(_ESCAPES[ch])
        elif ch.isprintable():
            parts.append(ch)
        else:
            parts.append("".join(f"\\x{b:02x}" for b in ch.encode("utf-8")))
    return "$'" + "".join(parts) + "'"


def _line(argv):
    return " ".join(_word(a) for a in argv)


def render_command(target, spec):
    """The ``hvdkit render`` argv that produces this file again (written into its header)."""
    argv = ["hvdkit", "render", target, "--name", spec.name, "-np", str(spec.num_proc)]
    argv += ["--nodes", str(spec.nodes), "--slots-per-node", str(spec.slots_per_node)]
    if target == "mpijob":
        argv += ["--image", spec.image]
    if target in ("slurm", "mpijob"):
        argv += ["--cpu", str(spec.cpu), "--memory", spec.memory, *spec.elastic_flags]
    if spec.hosts and target in ("mpirun", "horovodrun", "hostfile"):
        argv += ["-H", format_hosts(spec.hosts)]
    return [*argv, "--", *spec.command]


def _header(target, spec, what):
    return [
        f"# {what}",
        f"# Job {spec.name}: `{_line(spec.command)}` with -np {spec.num_proc}"
        f" on {spec.nodes} node(s) x {spec.slots_per_node} slot(s).",
        "# Rendered by hvdkit from one job description; change the description and render again:",
        f"#   {_line(render_command(target, spec))}",
    ]


def _slurm(spec):
    memory = _MEMORY.fullmatch(spec.memory)
    command = _line(spec.command)
    lines = [
        "#!/bin/bash",
        *_header("slurm", spec, "SLURM batch script: `sbatch slurm.sbatch` in the folder the command's paths start."),
        f"#SBATCH --job-name={spec.name}",
        f"#SBATCH --nodes={spec.nodes}",
        f"#SBATCH --ntasks={spec.num_proc}",
        f"#SBATCH --ntasks-per-node={spec.slots_per_node}",
        f"#SBATCH --cpus-per-task={spec.cpu // spec.slots_per_node}",
        f"#SBATCH --mem={memory.group(1)}{memory.group(2)[0]}",
        "set -euo pipefail",
        "",
        "# hvdkit must be on PATH on every node (activate its virtualenv here if needed).",
        "# hvdkit run reads this allocation's hosts from SLURM_JOB_NODELIST and SLURM_TASKS_PER_NODE,",
        "# starts mpirun with -H host:slots for them (mpirun reaches the other nodes through srun, not ssh)",
        "# and names the rank that fails first. `exec`: on scancel or preemption SLURM sends SIGTERM and",
        "# kills what is left of the job once the script's own process ends; hvdkit run must be that",
        "# process, so the ranks can save a checkpoint of the step they stopped at (see docs/slurm.md).",
        "# Without hvdkit run, when Slurm and Open MPI are built with PMIx, srun starts the ranks itself:",
        f"#   srun --mpi=pmix {command}",
        f'exec hvdkit run -np "$SLURM_NTASKS" -- {command}',
    ]
    if spec.elastic:
        lines = _slurm_elastic(lines, spec)
    return "\n".join(lines) + "\n"


def _slurm_elastic(lines, spec):
    """The batch script's lines made elastic: --no-kill, what elastic means there, the flags."""
    mem = next(i for i, line in enumerate(lines) if line.startswith("#SBATCH --mem="))
    run = lines[-1].replace(' -- ', f" {_line(spec.elastic_flags)} -- ", 1)
    return [*lines[: mem + 1], "#SBATCH --no-kill", *lines[mem + 1 : -1], *_SLURM_ELASTIC, run]


# What elastic means inside a SLURM allocation, written into an elastic batch script.
_SLURM_ELASTIC = [
    "# Elastic (--min-np/--max-np) inside a fixed allocation: the hosts are this allocation's nodes and",
    "# never more. When a node fails, hvdkit run relaunches on the nodes it can still reach over ssh,",
    "# while they hold --min-np slots, and grows back when the node answers again; the ranks resume",
    "# from their newest checkpoint. --no-kill keeps the allocation when a node fails (without it SLURM",
    "# ends the whole job). For nodes SLURM itself reports, pass --host-discovery-script with a script",
    "# that prints `host:slots` for the nodes of $SLURM_JOB_NODELIST that sinfo lists as up.",
]


def _mpijob_dict(spec):
    def container(name, args, **extra):
        # `args`, not `command`: Kubernetes' `command` would replace the image's entrypoint.
        return {"name": name, "image": spec.image, "args": list(args), **extra}

    elastic = [*spec.elastic_flags, "--host-discovery-script", MPI_OPERATOR_DISCOVERY] if spec.elastic else []
    launch = ["hvdkit", "run", "-np", str(spec.num_proc), *elastic, "--", *spec.command]
    sshd = ["/usr/sbin/sshd", "-De", "-f", f"{SSH_HOME}/.sshd_config"]
    limits = {"limits": {"cpu": str(spec.cpu), "memory": spec.memory}}
    return {
        "apiVersion": "kubeflow.org/v2beta1",
        "kind": "MPIJob",
        "metadata": {"name": spec.name},
        "spec": {
            "slotsPerWorker": spec.slots_per_node,
            "runPolicy": {"cleanPodPolicy": "Running"},
            "sshAuthMountPath": SSH_SECRET,
            "mpiImplementation": "OpenMPI",
            "mpiReplicaSpecs": {
                "Launcher": {"replicas": 1, "template": {"spec": {"containers": [container("launcher", launch)]}}},
                "Worker": {
                    "replicas": spec.nodes,
                    "template": {"spec": {"containers": [container("worker", sshd, resources=limits)]}},
                },
            },
        },
    }


def _mpijob(spec):
    import yaml  # only this target needs it; keeps `hvdkit` start-up light

    header = _header("mpijob", spec, "Kubeflow MPI Operator job: kubectl apply -f mpijob.yaml")
    header += [
        "# The launcher's `hvdkit run` reads the workers from the operator's "
        + ("discovery script (see below);" if spec.elastic else "hostfile (/etc/mpi/hostfile);"),
        f"# workers run sshd as user hvdkit with the config {SSH_HOME}/.sshd_config from the image.",
        "# Both run through the image's entrypoint (so `args`, not `command`): it makes a host key for",
        f"# each container and copies the operator's keys from {SSH_SECRET} into ~/.ssh, private.",
    ]
    if spec.elastic:
        header += [
            f"# Elastic: the operator keeps {MPI_OPERATOR_DISCOVERY} listing the running workers (`pod:slots`);",
            "# hvdkit run polls it, relaunches on the workers left after one fails (at least --min-np ranks)",
            "# and grows up to --max-np when workers are added (raise Worker replicas); ranks resume from the",
            "# newest checkpoint, so keep it on a volume every pod mounts. Kubernetes updates the mounted",
            "# script only after its ConfigMap sync (up to about a minute).",
        ]
    return "\n".join(header) + "\n" + yaml.safe_dump(_mpijob_dict(spec), sort_keys=False, default_flow_style=False)


def _script(spec, controller):
    tool = "mpirun" if controller == "mpi" else "horovodrun"
    job = JobSpec(spec.command, spec.num_proc, controller=controller, hosts=spec.launch_hosts)
    built = _plan.build(job, is_root=False, cores=spec.num_proc, python="python", base_env=SCRIPT_ENV)
    argv = [tool, *built.argv[1:]]
    dry_run = ["hvdkit", "run", "--dry-run", "-np", str(spec.num_proc), "-H", format_hosts(spec.launch_hosts)]
    if controller == "gloo":
        dry_run.append("--gloo")
    lines = [
        "#!/bin/bash",
        *_header(tool, spec, f"The plain {tool} line for this job, to start it without `hvdkit run`."),
        "# It is what this prints, less hvdkit's rank wrapper:",
        f"#   {_line([*dry_run, '--', *spec.command])}",
    ]
    if tool == "mpirun":
        lines += [
            "# Put your hosts in -H, or replace `-H ...` by `--hostfile FILE` (see hostfile.example).",
            "# As root add --allow-run-as-root.",
        ]
    else:
        lines += [
            "# Put your hosts in -H, or replace `-H ...` by `--hostfile FILE`: horovodrun reads only",
            "# `host slots=N` lines there, no comments and no blank lines.",
        ]
    lines += ["set -euo pipefail", *(f"export {k}={_word(v)}" for k, v in sorted(built.env.items()))]
    lines.append(f"exec {_line(argv)}")
    return "\n".join(lines) + "\n"


def _hostfile(spec):
    lines = [
        *_header("hostfile", spec, "Hostfile: one host per line with the number of ranks it runs (its slots)."),
        "# Read by `hvdkit run --hostfile FILE` and `mpirun --hostfile FILE`; '#' starts a comment.",
        "# hvdkit also takes horovodrun's form `node1:2`. `horovodrun --hostfile` takes only",
        "# `host slots=N` lines: strip the comments first (grep -v '^#' FILE).",
        *(f"{h.name} slots={h.slots}" for h in spec.launch_hosts),
    ]
    return "\n".join(lines) + "\n"


def render(target, spec):
    """The text of the ``target`` file (one of ``TARGETS``) for ``spec``."""
    if target == "slurm":
        return _slurm(spec)
    if target == "mpijob":
        return _mpijob(spec)
    if target in ("mpirun", "horovodrun"):
        return _script(spec, "mpi" if target == "mpirun" else "gloo")
    if target == "hostfile":
        return _hostfile(spec)
    raise ConfigError(f"unknown render target {target!r}; choose one of {', '.join(TARGETS)}")


# The job the committed files in launch/ describe.
EXAMPLE = RenderSpec(
    command=("python", "examples/torch_digits.py"),
    nodes=2,
    slots_per_node=2,
    image="hvdkit:cpu",
    name="hvdkit-digits",
    cpu=2,
    memory="4Gi",
)
EXAMPLE_FILES = {
    "slurm.sbatch": "slurm",
    "mpijob.yaml": "mpijob",
    "mpirun.sh": "mpirun",
    "horovodrun.sh": "horovodrun",
    "hostfile.example": "hostfile",
}


# The same job made elastic (2 to 4 ranks on the workers the MPI Operator lists).
EXAMPLE_ELASTIC = dataclasses.replace(EXAMPLE, name="hvdkit-digits-elastic", min_np=2, max_np=4)
EXAMPLE_ELASTIC_FILES = {"mpijob-elastic.yaml": "mpijob"}


def example_files(spec=EXAMPLE, elastic=EXAMPLE_ELASTIC):
    """``{file name: text}`` of the example files kept in the top-level ``launch/`` folder."""
    files = {name: render(target, spec) for name, target in EXAMPLE_FILES.items()}
    return {**files, **{name: render(target, elastic) for name, target in EXAMPLE_ELASTIC_FILES.items()}}


def save(path, text):
    """Write ``text`` to ``path``; scripts (``#!``) become executable."""
    try:
        with open(path, "w") as f:
            f.write(text)
        if text.startswith("#!"):
            os.chmod(path, 0o755)
    except OSError as e:
        problem = f"cannot write {path!r} ({e.strerror})"
        raise ConfigError(f"{problem}; check that its folder exists and is writable") from None


def main(argv=None):
    """Rewrite the example files in DIR (default ``launch``): ``python -m hvdkit.launch.render [DIR]``."""
    argv = sys.argv[1:] if argv is None else argv
    folder = argv[0] if argv else "launch"
    for name, text in example_files().items():
        save(os.path.join(folder, name), text)
        print(os.path.join(folder, name))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Cluster files from one job description: SLURM batch script, MPIJob, mpirun/horovodrun scripts, hostfile.

Pure: ``render`` returns text. ``save`` and ``main`` (``python -m hvdkit.launcher.render [DIR]``, which
rewrites the examples in the top-level ``launch/`` folder) are the only parts that write files.
"""

from __future__ import annotations

import dataclasses
import os
import shlex
import sys
from collections.abc import Sequence

from ...core.errors import ConfigError
from .. import plan as _plan
from ..hosts import format_hosts
from ..spec import JobSpec
from .spec import MEMORY_PATTERN, RenderSpec

__all__ = [
    "RenderSpec",
    "TARGETS",
    "EXAMPLE",
    "EXAMPLE_FILES",
    "EXAMPLE_ELASTIC",
    "EXAMPLE_GPU",
    "render",
    "render_command",
    "bash_word",
    "bash_line",
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

_ESCAPES = {"\n": "\\n", "\t": "\\t", "\r": "\\r", "\\": "\\\\", "'": "\\'"}


def bash_word(word: str) -> str:
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


def bash_line(argv: Sequence[str]) -> str:
    """The words of ``argv``, each quoted for bash (``bash_word``), joined by spaces on one line."""
    return " ".join(bash_word(a) for a in argv)


def render_command(target: str, spec: RenderSpec) -> list[str]:
    """The ``hvdkit render`` argv that produces this file again (written into its header)."""
    argv = ["hvdkit", "render", target, "--name", spec.name, "-np", str(spec.num_proc)]
    gpus = spec.gpus_per_node
    per_node = ["--gpus-per-node", str(gpus)] if gpus else ["--slots-per-node", str(spec.slots_per_node)]
    argv += ["--nodes", str(spec.nodes), *per_node]
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
        f"# Job {spec.name}: `{bash_line(spec.command)}` with -np {spec.num_proc}"
        f" on {spec.nodes} node(s) x {spec.slots_per_node} slot(s){' (one per GPU)' if spec.gpus_per_node else ''}.",
        "# Rendered by hvdkit from one job description; change the description and render again:",
        f"#   {bash_line(render_command(target, spec))}",
    ]


def _slurm(spec):
    if spec.elastic and spec.max_np is not None and spec.max_np > spec.num_proc:
        # The script's hosts are its allocation's (-np tasks) and never more: the job could not start.
        raise ConfigError(
            f"an elastic SLURM job grows only within its allocation of -np {spec.num_proc} tasks, so --max-np "
            f"{spec.max_np} can never be reached (hvdkit run would fail after the queue wait); render with "
            f"-np {spec.max_np} to allocate {spec.max_np} tasks, or --max-np {spec.num_proc}"
        )
    memory = MEMORY_PATTERN.fullmatch(spec.memory)
    command = bash_line(spec.command)
    lines = [
        "#!/bin/bash",
        *_header("slurm", spec, "SLURM batch script: `sbatch slurm.sbatch` in the folder the command's paths start."),
        f"#SBATCH --job-name={spec.name}",
        f"#SBATCH --nodes={spec.nodes}",
        f"#SBATCH --ntasks={spec.num_proc}",
        f"#SBATCH --ntasks-per-node={spec.slots_per_node}",
        f"#SBATCH --cpus-per-task={spec.cpu // spec.slots_per_node}",
        f"#SBATCH --mem={memory.group(1)}{memory.group(2)[0]}",
        *_slurm_gpus(spec),
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


def _slurm_gpus(spec):
    """The ``#SBATCH`` GPU request and why it has this form (nothing for a CPU job)."""
    if not spec.gpus_per_node:
        return []
    n = spec.gpus_per_node
    return [
        f"#SBATCH --gres=gpu:{n}",
        f"# One rank per GPU: {n} tasks and {n} GPUs per node (--gres=gpu:{n}; on select/cons_tres clusters",
        f"# --gpus-per-node={n} is the same). Not --gpus-per-task=1 nor --gpu-bind: they shut each task in with",
        "# one GPU, which stops NCCL's peer-to-peer copies between the ranks of a node, and the one daemon per",
        "# node that mpirun starts through srun would get a single GPU. Here every rank sees the node's GPUs",
        "# and takes the one of its local rank, under hvdkit run and under srun --mpi=pmix alike.",
    ]


def _slurm_elastic(lines, spec):
    """The batch script's lines made elastic: --no-kill, what elastic means there, the flags."""
    mem = next(i for i, line in enumerate(lines) if line.startswith("#SBATCH --mem="))
    run = lines[-1].replace(" -- ", f" {bash_line(spec.elastic_flags)} -- ", 1)
    return [*lines[: mem + 1], "#SBATCH --no-kill", *lines[mem + 1 : -1], *_SLURM_ELASTIC, run]


# What elastic means inside a SLURM allocation, written into an elastic batch script.
_SLURM_ELASTIC = [
    "# Elastic (--min-np/--max-np) inside a fixed allocation: the hosts are this allocation's nodes and",
    "# never more. When a node fails, hvdkit run relaunches on the nodes SLURM reports up (sinfo; no ssh",
    "# between nodes is needed), while they hold --min-np slots, and grows back when the node is up again;",
    "# the ranks resume from their newest checkpoint. --no-kill keeps the allocation when a node fails",
    "# (without it SLURM ends the whole job). Each node left out is logged with SLURM's state for it.",
]


def _mpijob_dict(spec):
    def container(name, args, **extra):
        # `args`, not `command`: Kubernetes' `command` would replace the image's entrypoint.
        return {"name": name, "image": spec.image, "args": list(args), **extra}

    # The operator's discover_hosts.sh lists bare worker names: their slots are the workers' slots.
    discovery = ["--host-discovery-script", MPI_OPERATOR_DISCOVERY, "--slots-per-host", str(spec.slots_per_node)]
    elastic = [*spec.elastic_flags, *discovery] if spec.elastic else []
    launch = ["hvdkit", "run", "-np", str(spec.num_proc), *elastic, "--", *spec.command]
    sshd = ["/usr/sbin/sshd", "-De", "-f", f"{SSH_HOME}/.sshd_config"]
    limits = {"limits": {"cpu": str(spec.cpu), "memory": spec.memory}}
    if spec.gpus_per_node:  # the NVIDIA device plugin's resource; a pod gets whole GPUs only
        limits["limits"]["nvidia.com/gpu"] = spec.gpus_per_node
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
    if spec.gpus_per_node:
        header += [
            f"# GPUs: each worker asks for {spec.gpus_per_node} (nvidia.com/gpu, the NVIDIA device plugin's "
            "resource) and",
            "# runs one rank per GPU (slotsPerWorker); the image needs a CUDA build of torch and an engine",
            "# built with NCCL. The launcher needs no GPU.",
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
    built = _plan.build(job, is_root=False, cores=spec.num_proc, python="python", base_env=SCRIPT_ENV, mpirun="mpirun")
    argv = [tool, *built.argv[1:]]
    dry_run = ["hvdkit", "run", "--dry-run", "-np", str(spec.num_proc), "-H", format_hosts(spec.launch_hosts)]
    if controller == "gloo":
        dry_run.append("--gloo")
    lines = [
        "#!/bin/bash",
        *_header(tool, spec, f"The plain {tool} line for this job, to start it without `hvdkit run`."),
        "# It is what this prints, less hvdkit's rank wrapper:",
        f"#   {bash_line([*dry_run, '--', *spec.command])}",
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
    lines += ["set -euo pipefail", *(f"export {k}={bash_word(v)}" for k, v in sorted(built.env.items()))]
    lines.append(f"exec {bash_line(argv)}")
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


def render(target: str, spec: RenderSpec) -> str:
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
# The same job on GPU nodes: 2 nodes x 4 GPUs, one rank per GPU.
EXAMPLE_GPU = dataclasses.replace(
    EXAMPLE,
    name="hvdkit-digits-gpu",
    num_proc=8,
    slots_per_node=None,
    gpus_per_node=4,
    cpu=8,
    memory="32Gi",
    image="hvdkit:gpu",
)
EXAMPLE_GPU_FILES = {"slurm-gpu.sbatch": "slurm", "mpijob-gpu.yaml": "mpijob"}


def example_files(
    spec: RenderSpec = EXAMPLE, elastic: RenderSpec = EXAMPLE_ELASTIC, gpu: RenderSpec = EXAMPLE_GPU
) -> dict[str, str]:
    """``{file name: text}`` of the example files kept in the top-level ``launch/`` folder."""
    files = {name: render(target, spec) for name, target in EXAMPLE_FILES.items()}
    files.update({name: render(target, elastic) for name, target in EXAMPLE_ELASTIC_FILES.items()})
    return {**files, **{name: render(target, gpu) for name, target in EXAMPLE_GPU_FILES.items()}}


def save(path: str, text: str) -> None:
    """Write ``text`` to ``path``; scripts (``#!``) become executable."""
    try:
        with open(path, "w") as f:
            f.write(text)
        if text.startswith("#!"):
            os.chmod(path, 0o755)
    except OSError as e:
        problem = f"cannot write {path!r} ({e.strerror})"
        raise ConfigError(f"{problem}; check that its folder exists and is writable") from None


def main(argv: Sequence[str] | None = None) -> int:
    """Rewrite the example files in DIR (default ``launch``): ``python -m hvdkit.launcher.render [DIR]``."""
    argv = sys.argv[1:] if argv is None else argv
    folder = argv[0] if argv else "launch"
    for name, text in example_files().items():
        save(os.path.join(folder, name), text)
        print(os.path.join(folder, name))
    return 0

"""What ``hvdkit render`` renders from: ``RenderSpec``, one job description, checked when it is made.

Every field is checked in ``__post_init__`` (a ConfigError names the bad value and the fix), so the
renderers in ``hvdkit.launcher.render.files`` only format.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ...core.errors import ConfigError
from ...core.options import check_positive_int
from ..hosts import Host, check_slots, format_hosts, total_slots

__all__ = ["RenderSpec", "check_gpus_per_node"]

# Whole-string matches only (fullmatch): `$` would also match before a trailing newline.
_NAME = re.compile(r"[a-z0-9]([-a-z0-9]{0,48}[a-z0-9])?")  # a Kubernetes name that leaves room for suffixes
MEMORY_PATTERN = re.compile(r"([1-9][0-9]{0,8})(Mi|Gi|Ti)")
_IMAGE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._/:@-]{0,254}")  # registry/path/name:tag@digest


def _default(value, fallback):
    return fallback if value is None else value


def _count(value, flag):
    return check_positive_int(flag, value)


@dataclass(frozen=True)
class RenderSpec:
    """One job: ``num_proc`` ranks of ``command`` on ``nodes`` machines, ``slots_per_node`` ranks on each.

    ``gpus_per_node`` (GPUs of each node the job takes; ``None`` for a CPU job) makes it one rank per
    GPU: ``slots_per_node`` defaults to it and may not differ from it.
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
    gpus_per_node: int | None = None  # GPUs per node (slurm: --gres=gpu:N, mpijob: nvidia.com/gpu), one rank each

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
        if self.gpus_per_node is not None:
            most = check_gpus_per_node(self.gpus_per_node)
            fill("gpus_per_node", most)
            if self.slots_per_node not in (None, most):
                raise ConfigError(
                    f"--slots-per-node {self.slots_per_node} differs from --gpus-per-node {most}: a GPU job runs one "
                    f"rank per GPU; drop --slots-per-node (or give --slots-per-node {most})"
                )
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
        if not isinstance(self.memory, str) or not MEMORY_PATTERN.fullmatch(self.memory):
            raise ConfigError(f"--memory {self.memory!r} must be a whole number of Mi, Gi or Ti, e.g. 4Gi")
        if not isinstance(self.image, str) or not _IMAGE.fullmatch(self.image):
            raise ConfigError(
                f"--image {self.image!r} must be an image reference (letters, digits and ._/:@-), e.g. hvdkit:cpu"
            )

    @property
    def elastic(self) -> bool:
        return self.min_np is not None or self.max_np is not None

    @property
    def elastic_flags(self) -> list[str]:
        """``--min-np MIN --max-np MAX`` for ``hvdkit run`` (empty when the job is not elastic)."""
        if not self.elastic:
            return []
        return [
            "--min-np",
            str(_default(self.min_np, self.num_proc)),
            "--max-np",
            str(_default(self.max_np, self.num_proc)),
        ]

    @property
    def launch_hosts(self) -> tuple[Host, ...]:
        """The hosts the mpirun/horovodrun scripts name: the given ones, else placeholders."""
        return self.hosts or tuple(Host(f"node{i}", self.slots_per_node) for i in range(1, self.nodes + 1))


def check_gpus_per_node(value: int | str) -> int:
    """``value`` as an int if it is a whole number of GPUs >= 1 (an int, or its digits as text), else ConfigError."""
    text = value.strip() if isinstance(value, str) else None
    number = int(text) if text is not None and text.isdigit() else value
    if isinstance(number, bool) or not isinstance(number, int) or number < 1:
        raise ConfigError(
            f"--gpus-per-node must be a whole number of GPUs >= 1 (got {value!r}): the GPUs each node gives the "
            "job, one rank per GPU, e.g. --gpus-per-node 4; leave it out for a CPU-only job"
        )
    return number


def _check_elastic(spec):
    """Raise ConfigError unless 1 <= --min-np <= -np <= --max-np (when either is given)."""
    lo = _count(_default(spec.min_np, spec.num_proc), "--min-np")
    hi = _count(_default(spec.max_np, spec.num_proc), "--max-np")
    if not lo <= spec.num_proc <= hi:
        raise ConfigError(
            f"elastic bounds need --min-np <= -np <= --max-np (got {lo} <= {spec.num_proc} <= {hi}); fix the "
            "one out of order"
        )


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

"""The GPU part of ``hvdkit doctor``: the GPUs and driver, torch's CUDA and NCCL, whether the engine
has NCCL, and a 2-rank NCCL allreduce when all of that is there.

torch and Horovod are asked in a child process (``hvdkit.launcher`` imports no framework), and only on
a machine with GPUs: a CPU-only machine gets one row, at the cost of one ``nvidia-smi`` look-up.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from ..core.devices import shared_gpu_env
from ..launcher.gpus import CUDA_VISIBLE_DEVICES, gpu_count, nvidia_smi, physical_gpus

__all__ = ["GpuFacts", "NO_GPU", "NCCL_SMOKE", "gpu_facts", "gpu_rows", "nccl_smoke_plan", "parse_gpu_query"]

NO_GPU = "no NVIDIA GPU found (CPU only)"
_QUERY = ["--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"]
_FIX_ENGINE_GPU = "rebuild the engine with NCCL: `hvdkit engine install --gpu` (needs a CUDA build of torch)"
# NCCL refuses two ranks on one GPU ("Duplicate GPU detected") unless this is set; it exists from NCCL 2.30.
MULTI_RANK_GPU = "NCCL_MULTI_RANK_GPU_ENABLE"
_MULTI_RANK_NCCL = (2, 30)

# Run in a child python: what torch and Horovod say about CUDA and NCCL, as one JSON line.
_TORCH_PROBE = """
import json
facts = {}
try:
    import torch
except Exception:
    facts["torch"] = None
else:
    facts["torch"] = torch.__version__
    facts["cuda"] = torch.version.cuda
    try:
        v = torch.cuda.nccl.version()
        facts["nccl"] = ".".join(map(str, v)) if isinstance(v, tuple) else str(v)
    except Exception:
        facts["nccl"] = None
    try:
        import horovod.torch as hvd
        facts["horovod_nccl"] = int(hvd.nccl_built())
    except Exception:
        facts["horovod_nccl"] = None
print("hvdkit-gpu-facts " + json.dumps(facts))
"""

# Each rank of the NCCL check: pins the GPU of its local rank, sums rank+1 on it; Horovod takes NCCL for CUDA tensors.
# With HVDKIT_PER_RANK_HOSTID=1 (ranks sharing a GPU under NCCL < 2.30) each rank names itself a host
# before its first NCCL call, which Horovod makes at the first allreduce of a CUDA tensor.
NCCL_SMOKE = """
import os, torch, horovod.torch as hvd
hvd.init()
shared = os.environ.get("HVDKIT_PER_RANK_HOSTID") == "1"
if shared:
    os.environ["NCCL_HOSTID"] = f"hvdkit-rank-{hvd.rank()}"
torch.cuda.set_device(hvd.local_rank() % torch.cuda.device_count())
got = hvd.allreduce(torch.tensor([float(hvd.rank() + 1)], device="cuda"), op=hvd.Sum, name="hvdkit.nccl_smoke").item()
want = hvd.size() * (hvd.size() + 1) / 2
how = ", sharing the GPU over loopback sockets" if shared else ""
print(f"allreduce ok: sum over {hvd.size()} ranks on cuda:{torch.cuda.current_device()}{how} = {got:g}" if got == want
      else f"allreduce WRONG: got {got}, want {want}")
"""


@dataclass(frozen=True)
class GpuFacts:
    """What doctor found: ``gpus`` ((name, memory) each, as nvidia-smi lists them), ``driver``, how many
    the ranks see (``visible``, after CUDA_VISIBLE_DEVICES), torch's ``cuda`` and ``nccl`` versions
    (``None``: a CPU build, or no torch) and ``horovod_nccl`` (the engine's NCCL version code, 0 for
    none, ``None`` when horovod.torch does not import)."""

    gpus: tuple = ()
    driver: str | None = None
    visible: int = 0
    torch: str | None = None
    cuda: str | None = None
    nccl: str | None = None
    horovod_nccl: int | None = None


def parse_gpu_query(text: str) -> tuple[list[tuple[str, str]], str | None]:
    """``([(name, memory), ...], driver)`` from the text of
    ``nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader``."""
    gpus, driver = [], None
    for line in text.splitlines():
        parts = [p.strip() for p in line.rsplit(",", 2)]  # a GPU name may hold a comma; the last two fields do not
        if len(parts) == 3 and parts[0]:
            gpus.append((parts[0], parts[1]))
            driver = driver or parts[2]
    return gpus, driver


def gpu_facts(
    python: str,
    run: Callable[[list[str], float], tuple[int, str]],
    *,
    smi: Callable[[Sequence[str]], str | None] | None = None,
    env: Mapping[str, str] | None = None,
    torch_installed: bool = True,
) -> GpuFacts:
    """The ``GpuFacts`` of this machine; ``run(argv, timeout)`` returns ``(rc, text)`` (doctor's ``_run``)."""
    smi = smi or nvidia_smi
    listing = smi(_QUERY)
    gpus, driver = parse_gpu_query(listing) if listing is not None else ([], None)
    if not gpus:  # no nvidia-smi: the driver's /proc entries still count the GPUs
        gpus = [("NVIDIA GPU (nvidia-smi not on PATH)", "memory unknown")] * physical_gpus(smi=lambda args: None)
    if not gpus:
        return GpuFacts()
    visible = gpu_count(env, physical=len(gpus))
    facts = {}
    if torch_installed:
        rc, text = run([python, "-c", _TORCH_PROBE], 120)
        m = re.search(r"^hvdkit-gpu-facts (\{.*\})$", text, re.MULTILINE) if rc == 0 else None
        facts = json.loads(m.group(1)) if m else {}
    asked = {name: facts.get(name) for name in ("torch", "cuda", "nccl", "horovod_nccl")}
    return GpuFacts(gpus=tuple(gpus), driver=driver, visible=visible, **asked)


def gpu_rows(
    facts: GpuFacts, row: Callable[..., None], engine_nccl: bool | None = None, env: Mapping[str, str] | None = None
) -> bool:
    """Doctor's rows for ``facts``; True when a NCCL allreduce check can run.

    A machine without GPUs is no problem. With GPUs, an engine without NCCL under a CUDA torch is one.
    ``engine_nccl`` (check-build's NCCL mark) stands in when horovod.torch did not import.
    """
    if not facts.gpus:
        row("nvidia gpus", NO_GPU)
        return False
    env = os.environ if env is None else env
    for i, (name, memory) in enumerate(facts.gpus):
        row(f"gpu {i}", f"{name}, {memory}")
    row("nvidia driver", facts.driver or "unknown (no nvidia-smi)")
    if CUDA_VISIBLE_DEVICES in env:
        row("gpus the ranks see", f"{facts.visible} ({CUDA_VISIBLE_DEVICES}={env[CUDA_VISIBLE_DEVICES]!r})")
    row("torch cuda", facts.cuda or ("none: a CPU build of torch, the GPUs go unused" if facts.torch else "no torch"))
    if not facts.cuda:
        return False
    row("nccl (torch)", facts.nccl or "none (torch built without NCCL)")
    has = bool(facts.horovod_nccl) if facts.horovod_nccl is not None else engine_nccl
    if has is None:
        row("horovod built with NCCL", "unknown (horovod.torch does not import; see the rows above)")
        return False
    row("horovod built with NCCL", f"yes ({_nccl_code(facts.horovod_nccl)})" if has else None, _FIX_ENGINE_GPU)
    return bool(has and facts.visible)


def _nccl_code(code):
    """Horovod's NCCL version code 22907 as ``NCCL 2.29.7`` (``NCCL`` when it is not a code)."""
    return f"NCCL {code // 10000}.{code // 100 % 100}.{code % 100}" if isinstance(code, int) and code > 1 else "NCCL"


def _version_tuple(text):
    return tuple(int(p) for p in re.findall(r"\d+", text or "")[:2])


def nccl_smoke_plan(facts: GpuFacts, ranks: int = 2) -> tuple[list[str] | None, str | None]:
    """``(extra hvdkit run args, skip reason)`` for the ``ranks``-rank NCCL check on ``facts.visible`` GPUs.

    More ranks than GPUs share them for this check only: NCCL >= 2.30 with NCCL_MULTI_RANK_GPU_ENABLE=1;
    older NCCL (which refuses two ranks on one GPU of one host) with a host id per rank and sockets on
    loopback (``hvdkit.core.devices.shared_gpu_env``). Without any GPU the check is skipped, with the reason.
    """
    if ranks <= facts.visible:
        return [], None
    if facts.visible < 1:
        return None, "skipped: no GPU visible to the ranks"
    if facts.nccl and _version_tuple(facts.nccl) < _MULTI_RANK_NCCL:
        env, _ = shared_gpu_env(_version_tuple(facts.nccl))
        env = {k: v for k, v in env.items() if k.startswith("NCCL_")} | {"HVDKIT_PER_RANK_HOSTID": "1"}
        return [a for k, v in env.items() for a in ("-x", f"{k}={v}")], None
    return ["-x", f"{MULTI_RANK_GPU}=1"], None

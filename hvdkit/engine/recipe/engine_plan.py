"""The engine build plan: which Horovod variant to build for an environment, and its exact settings.

``build-horovod.sh`` runs this file with the target environment's interpreter (standard library
only; it does not import hvdkit, which may not be installed there)::

    python engine_plan.py --gpu auto|on|off [--cuda-archs 90,100] --tensorflow yes|no --mpi yes|no [--describe]

It prints shell assignments that the recipe evaluates (``plan_*`` variables and the ``HOROVOD_*``
settings it exports before the build), or with ``--describe`` the plan in words (``--dry-run``).
A plan error exits 2 with one line on stdout naming the cause and the fix.

Variants:
- ``cpu``: torch, TensorFlow, MPI and Gloo, exactly the settings of the CPU recipe (no extra
  settings, nothing added to the wheel cache key: the same key and the same wheel as before GPU
  builds existed);
- ``gpu``: the same with ``HOROVOD_GPU_OPERATIONS=NCCL``, built when the installed torch is a CUDA
  build (``--gpu auto``, the default) or when asked (``--gpu on``). The CUDA toolkit is
  ``$HOROVOD_CUDA_HOME``, else the ``nvcc`` on PATH, else ``/usr/local/cuda``, else the toolkit tree
  of PyPI's CUDA wheels (``nvidia/cu13`` or ``nvidia/cu12`` in site-packages). NCCL is the one torch
  loads: the ``nccl.h`` and ``libnccl.so.2`` of the ``nvidia-nccl`` wheel (the recipe links a
  ``libnccl.so`` to it, which the wheel lacks). Architectures: ``--cuda-archs``, else the visible
  GPUs', else ``DEFAULT_CUDA_ARCHS``.
A framework or MPI that is absent is built without (``HOROVOD_WITHOUT_TENSORFLOW=1``,
``HOROVOD_WITHOUT_MPI=1``), and says so in the key.
"""

import argparse
import glob
import os
import re
import shlex
import shutil
import subprocess
import sys

# Turing (T4) 75, Ampere 80 (A100) and 86 (A10, RTX 30), Ada 89 (L4, L40, RTX 40), Hopper 90
# (H100, H200), Blackwell 100 (B200) and 120 (RTX 50): the data-centre GPUs of 2019-2026.
DEFAULT_CUDA_ARCHS = (75, 80, 86, 89, 90, 100, 120)
GPU_MODES = ("auto", "on", "off")


class PlanError(Exception):
    """No engine can be built as asked; the message names the cause and the fix."""


def parse_archs(text):
    """``"90,100"`` (or ``"9.0 10.0"``, ``"sm_90"``) as sorted unique ints; PlanError naming a bad item."""
    archs = set()
    for item in re.split(r"[,;\s]+", text.strip()):
        if not item:
            continue
        m = re.fullmatch(r"(?:sm_|compute_)?(\d{1,2})\.?(\d)", item)
        if not m:
            raise PlanError(
                f"--cuda-archs: {item!r} is not a CUDA architecture; give compute capabilities like 90 (H100) "
                "or 80,90,100 (A100, H100, B200), as nvidia-smi --query-gpu=compute_cap shows them"
            )
        archs.add(int(m.group(1) + m.group(2)))
    if not archs:
        raise PlanError(f"--cuda-archs: {text!r} names no architecture; give one like 90, or leave it out")
    return sorted(archs)


def plan(facts, gpu="auto", archs=None):
    """The build plan for ``facts`` (see ``gather_facts``): a dict with ``variant``, ``settings`` (an
    ordered list of ``(NAME, value)`` the recipe exports), ``key`` (what the cache key gains; empty for
    the plain CPU build), ``nccl_so`` (the library to link as ``libnccl.so``) and ``notes``.
    """
    if gpu not in GPU_MODES:
        raise PlanError(f"--gpu: {gpu!r} is not one of {', '.join(GPU_MODES)}")
    if archs:
        parse_archs(archs)  # a bad value is an error in every variant
    settings, key, notes = [], [], []
    if not facts.get("tensorflow"):
        settings.append(("HOROVOD_WITHOUT_TENSORFLOW", "1"))
        key.append("without-tensorflow")
        notes.append("TensorFlow is not installed: building for PyTorch only")
    if not facts.get("mpi"):
        settings.append(("HOROVOD_WITHOUT_MPI", "1"))
        key.append("without-mpi")
        notes.append("no Open MPI (mpicc) found: building with Gloo only (horovodrun --gloo, hvdkit run --gloo)")
    torch_cuda = facts.get("torch_cuda")
    want_gpu = gpu == "on" or (gpu == "auto" and bool(torch_cuda))
    if not want_gpu:
        if archs:
            notes.append("--cuda-archs ignored: this is a CPU build (torch is a CPU build; --gpu forces NCCL)")
        return {"variant": "cpu", "settings": settings, "key": "|".join(key), "nccl_so": "", "notes": notes}
    if not torch_cuda:
        raise PlanError(
            f"--gpu: torch {facts.get('torch_version')} in {facts.get('python')} is a CPU build; a GPU engine "
            "compiles against a CUDA build of torch. Install one (PyPI's default torch wheel is a CUDA build), "
            "or leave out --gpu for a CPU engine"
        )
    cuda_home = facts.get("cuda_home")
    if not cuda_home:
        major = str(torch_cuda).split(".")[0]
        raise PlanError(
            f"no CUDA compiler (nvcc) found for torch {facts.get('torch_version')} (CUDA {torch_cuda}): set "
            f"HOROVOD_CUDA_HOME to a CUDA {major} toolkit, put its nvcc on PATH, or install the toolkit wheels: "
            f"pip install 'nvidia-cuda-nvcc=={torch_cuda}.*' 'nvidia-cuda-runtime=={torch_cuda}.*' "
            f"'nvidia-cuda-crt=={torch_cuda}.*'"
        )
    if not facts.get("nccl_include") or not facts.get("nccl_so"):
        raise PlanError(
            f"no NCCL found for torch {facts.get('torch_version')}: the nvidia-nccl wheel torch depends on is "
            f"missing nccl.h or libnccl.so.2 in {facts.get('python')}'s site-packages. Reinstall it "
            "(pip install --force-reinstall nvidia-nccl-cu13, or -cu12 for a CUDA 12 torch) or set "
            "HOROVOD_NCCL_INCLUDE and HOROVOD_NCCL_LIB"
        )
    if archs:
        chosen, source = parse_archs(archs), "--cuda-archs"
    elif facts.get("visible_archs"):
        chosen, source = sorted(set(facts["visible_archs"])), "the visible GPUs"
    else:
        supported = facts.get("nvcc_archs") or []
        chosen = [a for a in DEFAULT_CUDA_ARCHS if not supported or a in supported]
        source = "the default list (no GPU visible; pick yours with --cuda-archs)"
    unsupported = [a for a in chosen if facts.get("nvcc_archs") and a not in facts["nvcc_archs"]]
    if unsupported:
        raise PlanError(
            f"--cuda-archs: nvcc {facts.get('nvcc_version')} in {cuda_home} cannot compile for "
            f"{', '.join(map(str, unsupported))}; it supports {', '.join(map(str, facts['nvcc_archs']))}"
        )
    cc_list = ",".join(map(str, chosen))
    settings += [
        ("HOROVOD_GPU_OPERATIONS", "NCCL"),
        ("HOROVOD_BUILD_CUDA_CC_LIST", cc_list),
        ("HOROVOD_CUDA_HOME", cuda_home),
        # torch.utils.cpp_extension (Horovod's FindPytorch asks it for the CUDA include and library
        # folders) finds its own CUDA_HOME: nvcc on PATH or /usr/local/cuda, never the pip wheels.
        ("CUDA_HOME", cuda_home),
        ("HOROVOD_NCCL_INCLUDE", facts["nccl_include"]),
        ("HOROVOD_NCCL_LINK", "SHARED"),
    ]
    key += [
        f"gpu-cuda{torch_cuda}",
        f"nvcc{facts.get('nvcc_version')}",
        f"nccl{facts.get('nccl_version')}",
        f"archs{cc_list}",
    ]
    notes.append(f"CUDA architectures {cc_list} (from {source})")
    return {"variant": "gpu", "settings": settings, "key": "|".join(key), "nccl_so": facts["nccl_so"], "notes": notes}


# ---- facts of the target environment --------------------------------------------------------------


def _site_dirs():
    return [p for p in sys.path if p.endswith(("site-packages", "dist-packages")) and os.path.isdir(p)]


def find_nccl(site_dirs):
    """``(include_dir, libnccl.so.2 path)`` of the nvidia-nccl wheel in ``site_dirs``, or ``(None, None)``."""
    for site in site_dirs:
        headers = sorted(glob.glob(os.path.join(site, "nvidia", "**", "nccl.h"), recursive=True))
        libs = sorted(glob.glob(os.path.join(site, "nvidia", "**", "libnccl.so.2"), recursive=True))
        if headers and libs:
            return os.path.dirname(headers[0]), libs[0]
    return None, None


def find_cuda_home(environ, site_dirs, which=shutil.which, isfile=os.path.isfile):
    """The CUDA toolkit to build with (see the module docstring for the order), or None."""
    if environ.get("HOROVOD_CUDA_HOME"):
        return environ["HOROVOD_CUDA_HOME"]
    nvcc = which("nvcc")
    if nvcc:
        home = os.path.dirname(os.path.dirname(os.path.realpath(nvcc)))
        # An nvcc that is a wrapper script (e.g. /usr/local/bin/nvcc running /usr/local/cuda-13.0/bin/nvcc)
        # does not sit in its toolkit: only a folder with the runtime headers is one.
        if any(
            isfile(os.path.join(home, *inc, "cuda_runtime.h"))
            for inc in (("include",), ("targets", "x86_64-linux", "include"), ("targets", "sbsa-linux", "include"))
        ):
            return home
    for home in ["/usr/local/cuda"] + [
        os.path.join(s, "nvidia", d) for s in site_dirs for d in ("cu13", "cu12", "cuda_nvcc")
    ]:
        if isfile(os.path.join(home, "bin", "nvcc")):
            return home
    return None


def _nvcc_facts(cuda_home):
    nvcc = os.path.join(cuda_home, "bin", "nvcc")
    try:
        text = subprocess.run([nvcc, "--version"], capture_output=True, text=True, timeout=60).stdout
        archs = subprocess.run([nvcc, "--list-gpu-arch"], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        return None, []
    m = re.search(r"release (\d+\.\d+)", text)
    return (m.group(1) if m else None), sorted({int(a) for a in re.findall(r"compute_(\d+)", archs)})


def gather_facts(tensorflow, mpi, gpu):
    """What the plan needs from this interpreter's environment (imports torch only for a GPU question)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        torch_version = version("torch")
    except PackageNotFoundError:
        torch_version = None
    facts = {"python": sys.executable, "torch_version": torch_version, "tensorflow": tensorflow, "mpi": mpi}
    if gpu == "off" or torch_version is None or ("+cpu" in torch_version and gpu == "auto"):
        return facts
    import torch  # a CUDA question: which CUDA, which NCCL, which GPUs

    facts["torch_cuda"] = torch.version.cuda
    if not torch.version.cuda:
        return facts
    try:
        facts["nccl_version"] = ".".join(map(str, torch.cuda.nccl.version()))
    except Exception:  # noqa: BLE001 - a torch without NCCL: find_nccl decides
        facts["nccl_version"] = "unknown"
    if torch.cuda.is_available():
        caps = {torch.cuda.get_device_capability(i) for i in range(torch.cuda.device_count())}
        facts["visible_archs"] = sorted(major * 10 + minor for major, minor in caps)
    sites = _site_dirs()
    facts["nccl_include"], facts["nccl_so"] = find_nccl(sites)
    if os.environ.get("HOROVOD_NCCL_INCLUDE") and os.environ.get("HOROVOD_NCCL_LIB"):
        facts["nccl_include"] = os.environ["HOROVOD_NCCL_INCLUDE"]
        facts["nccl_so"] = os.path.join(os.environ["HOROVOD_NCCL_LIB"], "libnccl.so.2")
    facts["cuda_home"] = find_cuda_home(os.environ, sites)
    if facts["cuda_home"]:
        facts["nvcc_version"], facts["nvcc_archs"] = _nvcc_facts(facts["cuda_home"])
    return facts


def shell(result):
    """The plan as shell assignments for the recipe to ``eval``."""
    lines = [f"plan_{k}={shlex.quote(str(result[k]))}" for k in ("variant", "key", "nccl_so")]
    lines.append("plan_settings=(" + " ".join(shlex.quote(f"{n}={v}") for n, v in result["settings"]) + ")")
    lines.append("plan_notes=(" + " ".join(shlex.quote(n) for n in result["notes"]) + ")")
    return "\n".join(lines)


def main(argv=None):
    p = argparse.ArgumentParser(description="print the Horovod engine build plan for this interpreter")
    p.add_argument("--gpu", default="auto", choices=GPU_MODES)
    p.add_argument("--cuda-archs", default="")
    p.add_argument("--tensorflow", choices=("yes", "no"), required=True)
    p.add_argument("--mpi", choices=("yes", "no"), required=True)
    args = p.parse_args(argv)
    try:
        facts = gather_facts(args.tensorflow == "yes", args.mpi == "yes", args.gpu)
        result = plan(facts, args.gpu, args.cuda_archs or None)
    except PlanError as e:
        print(e)
        return 2
    print(shell(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Helpers of tests/gpu: skip without a GPU, run 2 ranks on however many GPUs there are."""

import json

import pytest
from helpers import BIN, PYTHON, run_bounded

from hvdkit.core.devices import shared_gpu_env


def per_rank_hostid_argv(argv):
    """``argv`` run with ``NCCL_HOSTID`` set from the launcher's rank variable (horovodrun, mpirun, torchrun)."""
    script = 'export NCCL_HOSTID="hvdkit-rank-${HOROVOD_RANK:-${OMPI_COMM_WORLD_RANK:-${RANK:-0}}}"; exec "$@"'
    return ["bash", "-c", script, "hvdkit-rank", *map(str, argv)]


def gpu_or_skip():
    """``torch`` with CUDA and a GPU engine, or skip the test (CI has no GPU: ``make test-gpu`` runs these)."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU visible (tests/gpu runs on a GPU machine: make test-gpu)")
    hvd = pytest.importorskip("horovod.torch")
    if not hvd.nccl_built():
        pytest.skip("the installed Horovod engine has no NCCL: build it with hvdkit engine install --gpu")
    return torch


def gpu_job_env(torch, np_):
    """``(env, wrap)`` for ``np_`` ranks on this machine's GPUs: sharing settings where ranks outnumber them."""
    if np_ <= torch.cuda.device_count():
        return {}, lambda argv: argv
    env, per_rank = shared_gpu_env(torch.cuda.nccl.version())
    return env, (per_rank_hostid_argv if per_rank else (lambda argv: argv))


def run_gpu_worker(worker, out, np_=2, timeout=300):
    """Run ``worker OUT`` on ``np_`` ranks under horovodrun --gloo; every rank's JSON, by rank."""
    torch = gpu_or_skip()
    env, wrap = gpu_job_env(torch, np_)
    argv = [
        str(BIN / "horovodrun"),
        "-np",
        str(np_),
        "-H",
        f"localhost:{np_}",
        "--gloo",
        *wrap([PYTHON, str(worker), str(out)]),
    ]
    proc = run_bounded(argv, timeout, env=env)
    assert proc.returncode == 0, f"GPU job failed:\n{proc.stdout[-4000:]}\n{proc.stderr[-6000:]}"
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(np_)]

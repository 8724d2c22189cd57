"""The step breakdown on CUDA (CUDA events at the phase boundaries): 2 ranks under horovodrun --gloo.

Skipped without a GPU (``make test-gpu`` runs it; ``scripts/gpu-step.sh`` then runs the real sweep).
Toy models, a few steps: it checks that every phase is measured from CUDA events, is non-negative and
that the phases make up the wall-clock step, for DDP-NCCL, hvdkit and bucketed hvdkit; no timing.
"""

import json

from gpu_jobs import gpu_job_env, gpu_or_skip
from helpers import BIN, PYTHON, run_bounded

PHASES = ("forward", "backward", "exposed_comm", "optimizer", "host")


def test_every_cuda_step_is_cut_into_non_negative_phases_that_make_up_the_step(tmp_path):
    torch = gpu_or_skip()
    env, wrap = gpu_job_env(torch, 2)
    out = tmp_path / "breakdown.json"
    worker = [PYTHON, "-m", "hvdkit.bench.breakdown", str(out), "--device", "cuda", "--models", "tiny_mlp,tiny_bert"]
    worker += ["--steps=4", "--warmup=2", "--reps=2"]
    argv = [str(BIN / "horovodrun"), "-np", "2", "-H", "localhost:2", "--gloo", *wrap(worker)]
    proc = run_bounded(argv, 300, env=env)
    assert proc.returncode == 0, f"GPU job failed:\n{proc.stdout[-4000:]}\n{proc.stderr[-6000:]}"
    r = json.loads(out.read_text())
    assert r["device"] == "cuda" and r["gpu"]
    for model in r["models"].values():
        assert set(model["variants"]) == {"ddp", "hvdkit", "hvdkit_bucket"}
        for v in model["variants"].values():
            assert v["across_ranks_abs_diff"] == 0.0
            for step in v["steps"]:
                assert all(step[p] >= 0 for p in PHASES) and step["forward"] > 0 and step["backward"] > 0
                # host = wall-clock step - the events' span, so they add up unless the span outran the
                # wall clock (host clamped at 0): by at most a clock tick
                assert step["step"] - 1e-9 <= sum(step[p] for p in PHASES) <= step["step"] + 1e-3

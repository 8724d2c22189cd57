"""The step breakdown's arithmetic and the step sweep's plan (pure logic; the real jobs: tests/e2e/test_bench.py)."""

import json
import os

import pytest

from hvdkit.bench import step_sweep
from hvdkit.bench.breakdown import PHASES, phases_of, summarize

MARKS = {"start": 0.0, "fwd0": 0.5, "fwd1": 2.5, "grad": 6.5, "bwd": 6.75, "sync": 9.0, "end": 10.0}


def test_cpu_marks_cut_the_step_into_contiguous_phases():
    assert phases_of(MARKS) == {
        "forward": 2.0,
        "backward": 4.0,
        "exposed_comm": 2.5,  # from the last gradient to synchronize() returning
        "optimizer": 1.0,
        "host": 0.5,  # zero_grad before the forward pass
        "step": 10.0,
    }


def test_device_marks_leave_the_rest_of_the_wall_clock_step_to_the_host():
    phases = phases_of(MARKS, step_s=10.75)  # the device span from forward start to the end is 9.5
    assert phases["host"] == 1.25 and phases["step"] == 10.75
    assert sum(phases[p] for p in PHASES) == 10.75


def test_a_last_gradient_stamped_after_backward_returned_counts_as_backwards_end():
    phases = phases_of({**MARKS, "grad": 7.0, "sync": 6.75})  # DDP: averaged when backward() returns
    assert phases["backward"] == 4.25 and phases["exposed_comm"] == 0.0


def test_the_summary_means_sum_to_the_mean_step_and_bound_the_hidden_comm_by_backward():
    steps = [phases_of(MARKS), phases_of({**MARKS, "end": 12.0})]
    s = summarize(steps, comm_alone_s=4.5)
    assert s["phases_mean_s"]["optimizer"] == 2.0 and s["step_mean_s"] == 11.0 == sum(s["phases_mean_s"].values())
    assert s["hidden_comm_s"] == 2.0  # 4.5 s alone, 2.5 s of it exposed
    assert summarize(steps, comm_alone_s=100.0)["hidden_comm_s"] == 4.0  # at most the backward pass
    assert summarize(steps, comm_alone_s=1.0)["hidden_comm_s"] == 0.0
    assert summarize(steps, comm_alone_s=None)["hidden_comm_s"] is None


def test_the_gpu_plan_measures_the_defaults_first_then_every_variable_of_the_sweep():
    jobs = step_sweep.plan("cuda")
    assert [j.label for j in jobs[:2]] == ["hvdkit defaults", "Horovod defaults"]
    assert jobs[0].models == ("resnet50", "bert") and jobs[0].variants == ("ddp", "hvdkit", "hvdkit_bucket")
    assert jobs[1].env == {
        "HOROVOD_CYCLE_TIME": "1",
        "HOROVOD_CACHE_CAPACITY": "1024",
        "HOROVOD_FUSION_THRESHOLD": str(128 << 20),
    }
    resnet = [j for j in jobs[2:] if j.models == ("resnet50",) and not j.timeline]
    assert sorted((k, v) for j in resnet for k, v in j.env.items()) == [
        ("HOROVOD_BATCH_D2D_MEMCOPIES", "1"),
        ("HOROVOD_CYCLE_TIME", "0.1"),
        ("HOROVOD_CYCLE_TIME", "1"),
        ("HOROVOD_CYCLE_TIME", "5"),
        ("HOROVOD_ENABLE_ASYNC_COMPLETION", "1"),
        ("HOROVOD_FUSION_THRESHOLD", "0"),
        ("HOROVOD_FUSION_THRESHOLD", str(16 << 20)),
        ("HOROVOD_FUSION_THRESHOLD", str(64 << 20)),
        ("HOROVOD_NUM_NCCL_STREAMS", "2"),
    ]
    assert all("ddp" in j.variants for j in resnet)  # DDP beside every setting
    bert = [j for j in jobs if j.models == ("bert",)]
    assert [j.env for j in bert] == [j.env for j in resnet]  # the encoder's sweep comes last
    assert jobs.index(bert[0]) > max(jobs.index(j) for j in resnet)


def test_a_dry_run_lists_every_jobs_command_and_writes_the_plan(tmp_path, capsys):
    r = step_sweep.run_sweep(str(tmp_path), device="cpu", quick=True, dry_run=True)
    assert r["dry_run"] and [j.get("result") for j in r["jobs"]] == [None, None]
    argv = r["jobs"][1]["argv"]
    assert argv[1:6] == ["-np", "2", "-H", "localhost:2", "--gloo"]
    assert (
        argv[argv.index("--models") + 1] == "tiny_mlp,tiny_bert" and argv[argv.index("--variants") + 1] == "ddp,hvdkit"
    )
    saved = json.loads((tmp_path / "step_sweep.json").read_text())
    assert saved["plan"] == ["hvdkit defaults", "Horovod defaults"]
    assert "step sweep 2/2 Horovod defaults: " in capsys.readouterr().err


def _result(step_ms):
    phases = dict(zip(PHASES, (1e-3, 2e-3, step_ms * 1e-3 - 4e-3, 0.5e-3, 0.5e-3), strict=True))
    return {"phases_mean_s": phases, "step_mean_s": step_ms * 1e-3, "hidden_comm_s": 1e-3, "comm_alone_s": 3e-3}


def test_the_table_gives_ddps_step_over_each_variants_and_names_jobs_that_did_not_run(tmp_path):
    results = {
        "np": 2,
        "device": "cuda",
        "shared_gpu": True,
        "complete": False,
        "jobs": [
            {"label": "a", "result": {"models": {"m": {"variants": {"ddp": _result(10), "hvdkit": _result(20)}}}}},
            {"label": "b", "error": "benchmark job failed (exit 1)\nTraceback"},
            {"label": "c", "skipped": "12 s left, a job like it took 30 s"},
        ],
    }
    text = step_sweep.table(results)
    assert "sharing a GPU -- cut off: partial results" in text
    assert "| a | m | hvdkit | 20.0 | 1.0 | 2.0 | 16.0 | 0.5 | 0.5 | 1.0 | 3.0 | 0.50 |" in text
    assert "b: error: benchmark job failed (exit 1)" in text and "c: skipped: 12 s left" in text
    png = step_sweep.plot(results, str(tmp_path / "p.png"))
    assert open(png, "rb").read(8) == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("content", [None, "{not json"])
def test_report_of_a_missing_or_damaged_file_says_so(tmp_path, capsys, content):
    path = tmp_path / "step_sweep.json"
    if content is not None:
        path.write_text(content)
    assert step_sweep.report(str(path)) == 2
    assert "cannot read" in capsys.readouterr().err


def test_the_gpu_script_dry_run_lists_the_whole_plan_with_the_shared_gpu_settings(tmp_path):
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[3]
    env = {**os.environ, "DRY_RUN": "1", "OUT": str(tmp_path), "PYTHON": sys.executable}
    proc = subprocess.run(
        ["bash", str(root / "scripts" / "gpu-step.sh")], env=env, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    saved = json.loads((tmp_path / "step_sweep.json").read_text())
    assert saved["device"] == "cuda" and saved["dry_run"] and len(saved["jobs"]) == len(step_sweep.plan("cuda")) == 21
    # no GPU here: 2 ranks outnumber the GPUs, so they share one (NCCL 2.28's rules: a host id each, sockets)
    assert saved["base_env"]["HVDKIT_SHARE_GPUS"] == "1" and saved["base_env"]["HVDKIT_PER_RANK_HOSTID"] == "1"
    argv = saved["jobs"][0]["argv"]
    assert argv[argv.index("--device") + 1] == "cuda" and "--steps=20" in argv and "--warmup=10" in argv
    assert "--steps=16" in saved["jobs"][2]["argv"]
    assert "step sweep 21/21 batched D2D copies" in proc.stdout


def test_after_a_failed_first_job_the_rest_are_skipped_and_a_job_that_would_not_fit_too(tmp_path, monkeypatch):
    calls = []

    def failing(name, argv, path, env, timeout):
        calls.append(name)
        raise RuntimeError("benchmark job failed (exit 1): no GPU")

    monkeypatch.setattr(step_sweep, "run_bench_job", failing)
    r = step_sweep.run_sweep(str(tmp_path), device="cpu", quick=True)
    assert calls == ["step sweep 1/2 hvdkit defaults"]
    assert "no GPU" in r["jobs"][0]["error"] and r["jobs"][1]["skipped"] == "the first job failed (see its error)"

    def slow(name, argv, path, env, timeout):
        calls.append(name)
        import time

        time.sleep(0.3)
        return {"models": {}}

    calls.clear()
    monkeypatch.setattr(step_sweep, "run_bench_job", slow)
    r = step_sweep.run_sweep(str(tmp_path), device="cpu", quick=True, budget=5.4)  # the second needs 1.1 x 0.3 + 5
    assert calls == ["step sweep 1/2 hvdkit defaults"] and "left, a job like it took" in r["jobs"][1]["skipped"]
    assert json.loads((tmp_path / "step_sweep.json").read_text())["jobs"][1]["skipped"]

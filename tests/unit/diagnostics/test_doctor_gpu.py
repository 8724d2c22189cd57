"""hvdkit doctor's GPU section with injected probes: a CPU-only machine is no problem; GPUs list with
driver, torch's CUDA and NCCL, the engine's NCCL, and a 2-rank NCCL check shaped by the GPU count."""

import io
import json

import pytest

from hvdkit.diagnostics import doctor, doctor_gpu
from hvdkit.diagnostics.doctor_gpu import NO_GPU, GpuFacts, gpu_facts, gpu_rows, nccl_smoke_plan, parse_gpu_query

QUERY = "NVIDIA H100 80GB HBM3, 81559 MiB, 570.86.15\nNVIDIA H100 80GB HBM3, 81559 MiB, 570.86.15\n"
H100 = ("NVIDIA H100 80GB HBM3", "81559 MiB")
CUDA = GpuFacts(
    gpus=(H100, H100),
    driver="570.86.15",
    visible=2,
    torch="2.13.0+cu130",
    cuda="13.0",
    nccl="2.29.7",
    horovod_nccl=22907,
)


def _rows(facts, **kw):
    rows = {}
    check = gpu_rows(
        facts, lambda name, value, fix=None: rows.setdefault(name, (value, fix)), env=kw.pop("env", {}), **kw
    )
    return rows, check


def test_the_gpu_query_is_parsed_into_names_memory_and_driver():
    assert parse_gpu_query(QUERY) == ([H100, H100], "570.86.15")
    assert parse_gpu_query("Tesla T4, a, b, 15360 MiB, 535.1\n") == ([("Tesla T4, a, b", "15360 MiB")], "535.1")
    assert parse_gpu_query("") == ([], None)


def test_a_machine_without_gpus_gets_one_row_and_no_problem():
    rows, check = _rows(GpuFacts())
    assert rows == {"nvidia gpus": (NO_GPU, None)} and check is False


def test_without_nvidia_smi_nor_driver_no_child_python_is_started(monkeypatch):
    monkeypatch.setattr(doctor_gpu, "physical_gpus", lambda smi: 0)
    run = lambda argv, timeout: pytest.fail("asked torch on a machine without GPUs")  # noqa: E731
    assert gpu_facts("python", run, smi=lambda args: None, env={}) == GpuFacts()


def test_gpu_facts_read_nvidia_smi_and_the_child_pythons_answer():
    answer = {"torch": "2.13.0+cu130", "cuda": "13.0", "nccl": "2.29.7", "horovod_nccl": 22907}
    seen = []

    def run(argv, timeout):
        seen.append(argv[:2])
        return 0, "some warning\nhvdkit-gpu-facts " + json.dumps(answer) + "\n"

    facts = gpu_facts(
        "py",
        run,
        smi=lambda args: QUERY if "--format=csv,noheader" in args else None,
        env={"CUDA_VISIBLE_DEVICES": "1"},
    )
    assert facts == GpuFacts((H100, H100), "570.86.15", 1, "2.13.0+cu130", "13.0", "2.29.7", 22907)
    assert seen == [["py", "-c"]]


def test_a_cuda_machine_lists_gpus_driver_cuda_nccl_and_the_engines_nccl():
    rows, check = _rows(CUDA)
    assert rows["gpu 0"] == ("NVIDIA H100 80GB HBM3, 81559 MiB", None) and "gpu 1" in rows
    assert rows["nvidia driver"][0] == "570.86.15"
    assert rows["torch cuda"][0] == "13.0" and rows["nccl (torch)"][0] == "2.29.7"
    assert rows["horovod built with NCCL"][0] == "yes (NCCL 2.29.7)"
    assert check is True


def test_an_engine_without_nccl_under_a_cuda_torch_is_a_problem_with_the_fix():
    rows, check = _rows(GpuFacts(**{**CUDA.__dict__, "horovod_nccl": 0}))
    value, fix = rows["horovod built with NCCL"]
    assert value is None and "hvdkit engine install --gpu" in fix and check is False


def test_check_builds_nccl_mark_stands_in_when_horovod_torch_does_not_import():
    rows, check = _rows(GpuFacts(**{**CUDA.__dict__, "horovod_nccl": None}), engine_nccl=True)
    assert rows["horovod built with NCCL"][0] == "yes (NCCL)" and check is True


def test_a_cpu_torch_on_a_gpu_machine_is_said_and_no_nccl_check_runs():
    rows, check = _rows(GpuFacts(gpus=(H100,), driver="570", visible=1, torch="2.13.0+cpu"))
    assert rows["torch cuda"][0].startswith("none: a CPU build of torch")
    assert "horovod built with NCCL" not in rows and check is False


def test_gpus_hidden_by_cuda_visible_devices_are_shown_and_skip_the_check():
    rows, check = _rows(GpuFacts(**{**CUDA.__dict__, "visible": 0}), env={"CUDA_VISIBLE_DEVICES": "-1"})
    assert rows["gpus the ranks see"][0] == "0 (CUDA_VISIBLE_DEVICES='-1')" and check is False


def test_two_ranks_on_two_gpus_need_no_extra_setting():
    assert nccl_smoke_plan(CUDA) == ([], None)


def test_two_ranks_on_one_gpu_set_multi_rank_for_the_check_with_nccl_2_30():
    facts = GpuFacts(**{**CUDA.__dict__, "visible": 1, "nccl": "2.30.7"})
    assert nccl_smoke_plan(facts) == (["-x", "NCCL_MULTI_RANK_GPU_ENABLE=1"], None)


def test_two_ranks_on_one_gpu_with_older_nccl_get_a_host_id_each_and_loopback_sockets():
    extra, why = nccl_smoke_plan(GpuFacts(**{**CUDA.__dict__, "visible": 1}))  # NCCL 2.29.7
    assert why is None
    settings = dict(a.split("=", 1) for a in extra[1::2])
    assert set(extra[0::2]) == {"-x"}
    assert settings["HVDKIT_PER_RANK_HOSTID"] == "1" and settings["NCCL_SOCKET_IFNAME"] == "lo"
    assert settings["NCCL_P2P_DISABLE"] == settings["NCCL_SHM_DISABLE"] == "1"
    assert "NCCL_MULTI_RANK_GPU_ENABLE" not in settings


def test_no_visible_gpu_skips_the_nccl_check_saying_why():
    extra, why = nccl_smoke_plan(GpuFacts(**{**CUDA.__dict__, "visible": 0}))
    assert extra is None and "no GPU" in why


def _diagnose_with(monkeypatch, facts, smoke=True):
    """doctor.diagnose with every tool check passing and the smokes recorded instead of run."""
    monkeypatch.setattr(doctor, "_version", lambda *names: "1.0")
    monkeypatch.setattr(
        doctor,
        "_run",
        lambda argv, timeout: (
            0,
            "mpirun (Open MPI) 4.1.4\n"
            if "--version" in argv
            else "[X] PyTorch\n[X] TensorFlow\n[X] MPI\n[X] Gloo\n[X] NCCL\n",
        ),
    )
    monkeypatch.setattr(doctor, "_engine_fixes_row", lambda installed, row: row("horovod engine fixes", "ok"))
    smokes = []

    def smoke_run(python, controller, *args, extra=(), program=("-m", "hvdkit.torch.smoke"), **kw):
        smokes.append((controller, list(extra), program[0]))
        return True, "ok (sum over 2 ranks = 3)"

    monkeypatch.setattr(doctor, "_smoke", smoke_run)
    out = io.StringIO()
    problems = doctor.diagnose(smoke=smoke, out=out, gpu_facts=lambda: facts)
    return problems, out.getvalue(), smokes


def test_doctor_on_a_cpu_machine_says_cpu_only_and_passes(monkeypatch):
    problems, text, smokes = _diagnose_with(monkeypatch, GpuFacts())
    assert problems == [] and f"nvidia gpus                {NO_GPU}" in text
    assert [s[0] for s in smokes] == ["mpi", "gloo"]


def test_doctor_on_a_gpu_machine_runs_the_nccl_check_after_the_cpu_ones(monkeypatch):
    problems, text, smokes = _diagnose_with(monkeypatch, GpuFacts(**{**CUDA.__dict__, "visible": 1, "nccl": "2.30.7"}))
    assert problems == [] and "2-rank allreduce (nccl)" in text
    assert smokes[-1] == ("mpi", ["-x", "NCCL_MULTI_RANK_GPU_ENABLE=1"], "-c")


def test_doctor_without_smoke_runs_no_nccl_check(monkeypatch):
    problems, text, smokes = _diagnose_with(monkeypatch, CUDA, smoke=False)
    assert smokes == [] and "allreduce" not in text and "horovod built with NCCL    yes" in text


def _smoke_argv(monkeypatch, **kwargs):
    """The ``hvdkit run`` command line doctor._smoke starts (both ranks answer ok)."""
    seen = []
    monkeypatch.setattr(doctor, "_run", lambda argv, timeout: (seen.append(argv), (0, "allreduce ok: 3\n" * 2))[1])
    ok, _ = doctor._smoke("python", "mpi", **kwargs)
    assert ok
    return seen[0]


def test_the_cpu_check_runs_its_ranks_on_the_cpu_so_a_one_gpu_host_does_not_refuse_two_ranks(monkeypatch):
    # On a one-GPU H100 the CPU check failed: its 2 ranks called hk.init(), which refuses 2 ranks on 1 GPU.
    argv = _smoke_argv(monkeypatch)
    run_args = argv[: argv.index("--")]
    assert ["-x", "HVDKIT_DEVICE=cpu"] == run_args[run_args.index("HVDKIT_DEVICE=cpu") - 1 :][:2]
    nccl = _smoke_argv(monkeypatch, extra=["-x", "NCCL_MULTI_RANK_GPU_ENABLE=1"], program=["-c", "print()"])
    assert "HVDKIT_DEVICE=cpu" not in nccl  # the NCCL check is meant to use the GPU

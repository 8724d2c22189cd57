"""The engine build plan (hvdkit/engine/recipe/engine_plan.py): variants and exact settings, no GPU needed."""

import importlib.util
import os
import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hvdkit import engine

spec = importlib.util.spec_from_file_location("engine_plan", engine.RECIPE / "engine_plan.py")
ep = importlib.util.module_from_spec(spec)
spec.loader.exec_module(ep)

CUDA_FACTS = {
    "python": "/venv/bin/python",
    "torch_version": "2.14.1",
    "torch_cuda": "13.0",
    "tensorflow": False,
    "mpi": True,
    "nccl_version": "2.30.7",
    "nccl_include": "/site/nvidia/nccl/include",
    "nccl_so": "/site/nvidia/nccl/lib/libnccl.so.2",
    "cuda_home": "/usr/local/cuda",
    "nvcc_version": "13.0",
    "nvcc_archs": [75, 80, 86, 87, 89, 90, 100, 103, 110, 120, 121],
}


def test_the_cpu_build_adds_no_setting_and_nothing_to_the_key():
    p = ep.plan({"torch_version": "2.13.0+cpu", "tensorflow": True, "mpi": True})
    assert (p["variant"], p["settings"], p["key"], p["nccl_so"]) == ("cpu", [], "", "")


def _cuda_torch():
    import torch

    return bool(torch.version.cuda)


cpu_torch_only = pytest.mark.skipif(
    _cuda_torch(), reason="checks this environment's CPU build (torch here is a CUDA build)"
)


@cpu_torch_only
def test_the_cpu_builds_wheel_folder_is_the_one_it_had_before_gpu_builds():
    """The recipe's CPU key (the block hash and inputs) is unchanged by GPU settings in the environment."""
    plain = engine.wheel_dir()
    assert engine.wheel_dir(gpu=False, cuda_archs="90") == plain
    text = engine.plan()
    assert "variant:   cpu" in text and "HOROVOD_GPU_OPERATIONS" not in text
    assert [line.strip() for line in text.splitlines() if line.strip().startswith("HOROVOD_")] == [
        "HOROVOD_WITH_MPI=1",
        "HOROVOD_WITH_GLOO=1",
        "HOROVOD_WITH_PYTORCH=1",
        "HOROVOD_WITH_TENSORFLOW=1",
        "HOROVOD_WITHOUT_MXNET=1",
    ]


def test_a_cuda_torch_gets_nccl_with_torchs_own_nccl_and_the_asked_architectures():
    p = ep.plan(CUDA_FACTS, archs="90,100")
    assert p["variant"] == "gpu"
    settings = dict(p["settings"])
    assert settings["HOROVOD_GPU_OPERATIONS"] == "NCCL"
    assert settings["HOROVOD_BUILD_CUDA_CC_LIST"] == "90,100"
    assert settings["HOROVOD_NCCL_INCLUDE"] == "/site/nvidia/nccl/include" and settings["HOROVOD_NCCL_LINK"] == "SHARED"
    assert settings["HOROVOD_WITHOUT_TENSORFLOW"] == "1"  # torch-only where TensorFlow is absent
    assert p["nccl_so"].endswith("libnccl.so.2")
    for part in ("gpu-cuda13.0", "nccl2.30.7", "archs90,100", "without-tensorflow"):
        assert part in p["key"]


def test_architectures_default_to_the_visible_gpus_then_to_the_documented_list():
    assert dict(ep.plan(dict(CUDA_FACTS, visible_archs=[90]))["settings"])["HOROVOD_BUILD_CUDA_CC_LIST"] == "90"
    default = dict(ep.plan(CUDA_FACTS)["settings"])["HOROVOD_BUILD_CUDA_CC_LIST"]
    assert default == ",".join(map(str, ep.DEFAULT_CUDA_ARCHS))


def test_keys_differ_by_architectures_cuda_and_nccl():
    keys = {
        ep.plan(dict(CUDA_FACTS, **change), archs=a)["key"]
        for change, a in (({}, "90"), ({}, "80"), ({"torch_cuda": "12.8"}, "90"), ({"nccl_version": "2.27.5"}, "90"))
    }
    assert len(keys) == 4


@pytest.mark.parametrize(
    "facts, message",
    [
        (
            dict(CUDA_FACTS, torch_cuda=None, torch_version="2.13.0+cpu"),
            "torch 2.13.0+cpu in /venv/bin/python is a CPU build",
        ),
        (dict(CUDA_FACTS, cuda_home=None), "no CUDA compiler (nvcc) found for torch 2.14.1 (CUDA 13.0)"),
        (dict(CUDA_FACTS, nccl_so=None), "no NCCL found for torch 2.14.1"),
    ],
)
def test_a_gpu_build_that_cannot_work_is_refused_with_the_cause(facts, message):
    with pytest.raises(ep.PlanError, match=re.escape(message)):
        ep.plan(facts, gpu="on")


def test_an_architecture_nvcc_cannot_build_is_named():
    with pytest.raises(ep.PlanError, match="cannot compile for 60"):
        ep.plan(CUDA_FACTS, archs="60,90")


@given(
    st.lists(st.integers(50, 129), min_size=1, max_size=6),
    st.sampled_from([",", ", ", ";", " "]),
    st.sampled_from(["", "sm_", "compute_"]),
)
def test_parse_archs_reads_every_spelling_of_a_list(archs, sep, prefix):
    assert ep.parse_archs(sep.join(f"{prefix}{a}" for a in archs)) == sorted(set(archs))


@pytest.mark.parametrize("bad", ["9x", "hopper", "1000", ",", "90,abc"])
def test_parse_archs_names_the_bad_item(bad):
    with pytest.raises(ep.PlanError, match="--cuda-archs"):
        ep.parse_archs(bad)


@cpu_torch_only
def test_the_recipe_refuses_gpu_on_a_cpu_torch_and_a_bad_arch_before_building(capsys):
    from hvdkit.cli import main

    assert main(["engine", "install", "--gpu", "--dry-run"]) == 2
    assert "is a CPU build; a GPU engine compiles against a CUDA build of torch" in capsys.readouterr().err
    assert main(["engine", "install", "--dry-run", "--cuda-archs", "hopper"]) == 2
    assert "'hopper' is not a CUDA architecture" in capsys.readouterr().err


def test_find_nccl_and_cuda_home_read_a_pip_toolkit_tree(tmp_path):
    site = tmp_path / "site-packages"
    (site / "nvidia" / "nccl" / "include").mkdir(parents=True)
    (site / "nvidia" / "nccl" / "include" / "nccl.h").write_text("")
    (site / "nvidia" / "nccl" / "lib").mkdir()
    (site / "nvidia" / "nccl" / "lib" / "libnccl.so.2").write_text("")
    (site / "nvidia" / "cu13" / "bin").mkdir(parents=True)
    (site / "nvidia" / "cu13" / "bin" / "nvcc").write_text("")
    assert ep.find_nccl([str(site)]) == (str(site / "nvidia/nccl/include"), str(site / "nvidia/nccl/lib/libnccl.so.2"))
    in_site = lambda path: path.startswith(str(site)) and os.path.isfile(path)  # noqa: E731 - not this machine's CUDA
    assert ep.find_cuda_home({}, [str(site)], which=lambda _: None, isfile=in_site) == str(site / "nvidia" / "cu13")
    assert ep.find_cuda_home({"HOROVOD_CUDA_HOME": "/opt/cuda"}, [str(site)]) == "/opt/cuda"

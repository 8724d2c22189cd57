"""scripts/cuda-toolkit-wheels.sh against trees laid out as PyPI's NVIDIA wheels lay them out.

The file lists are the wheels' own (``unzip -Z1``), less their headers other than cuda_runtime.h,
their ``__init__.py`` files and dist-info. The CUDA 13 wheels fill one tree, nvidia/cu13, with the
compiler; the CUDA 12 ones hold no nvcc at all (nvidia-cuda-nvcc-cu12 12.6.85, 12.8.93 and 12.9.86
alike: ptxas, libnvvm, libdevice), so the script refuses a CUDA 12 torch (issue 35, item 15; it used
to install them and look for include/cuda_runtime.h and lib/ in the nvcc wheel's tree).
A fake ``$PYTHON`` answers the script's torch query and lays out the listed files for ``pip install``.
"""

import subprocess

from helpers import ROOT

SCRIPT = ROOT / "scripts" / "cuda-toolkit-wheels.sh"

# nvidia-cuda-nvcc 13.0.88 and nvidia-cuda-runtime 13.0.96 (what cuda-toolkit[nvcc,...]==13.0.3 installs)
CU13_FILES = """\
nvidia/cu13/bin/__nvcc_device_query
nvidia/cu13/bin/bin2c
nvidia/cu13/bin/cudafe++
nvidia/cu13/bin/fatbinary
nvidia/cu13/bin/nvcc
nvidia/cu13/bin/nvcc.profile
nvidia/cu13/bin/nvlink
nvidia/cu13/bin/ptxas
nvidia/cu13/bin/crt/link.stub
nvidia/cu13/bin/crt/prelink.stub
nvidia/cu13/lib/libcudadevrt.a
nvidia/cu13/lib/libcudart.so.13
nvidia/cu13/lib/libcudart_static.a
nvidia/cu13/include/cuda_runtime.h
"""
# nvidia-cuda-nvcc-cu12 12.8.93 and nvidia-cuda-runtime-cu12 12.8.90
CU12_FILES = """\
nvidia/cuda_nvcc/bin/ptxas
nvidia/cuda_nvcc/nvvm/lib64/libnvvm.so
nvidia/cuda_nvcc/nvvm/libdevice/libdevice.10.bc
nvidia/cuda_nvcc/include/crt/host_config.h
nvidia/cuda_runtime/lib/libcudart.so.12
nvidia/cuda_runtime/include/cuda_runtime.h
"""

FAKE_PYTHON = r"""#!/bin/bash
# The script's $PYTHON: its torch query answers "CUDA META SITE"; `-m pip install` records its
# arguments and lays out $FILES under $SITE (every bin/ file a stub nvcc would be).
if [[ $1 == -m && $2 == pip ]]; then
  echo "${@:3}" >> "$SITE/../pip.log"
  while read -r f; do
    mkdir -p "$SITE/${f%/*}"
    printf '#!/bin/sh\necho "Cuda compilation tools, release %s, V0"\n' "$CUDA" > "$SITE/$f"
    chmod +x "$SITE/$f"
  done <<< "$FILES"
  exit 0
fi
cat > /dev/null
echo "$CUDA $META $SITE"
"""


def run_script(tmp_path, cuda, meta, files):
    site = tmp_path / "site-packages"
    site.mkdir()
    python = tmp_path / "python"
    python.write_text(FAKE_PYTHON)
    python.chmod(0o755)
    env = {"PATH": "/usr/bin:/bin", "PYTHON": str(python), "SITE": str(site), "CUDA": cuda, "META": meta}
    proc = subprocess.run(["bash", str(SCRIPT)], env={**env, "FILES": files}, capture_output=True, text=True)
    log = tmp_path / "pip.log"
    return proc, site, (log.read_text().splitlines() if log.exists() else [])


def test_a_cuda_13_torch_gets_the_toolkit_tree_of_its_meta_package(tmp_path):
    proc, site, pip = run_script(tmp_path, "13.0", "13.0.3", CU13_FILES)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == f"{site}/nvidia/cu13\n"
    assert pip == ["install --quiet cuda-toolkit[nvcc,crt,cccl,cudart]==13.0.3"]
    assert "toolkit: " in proc.stderr and "(release 13.0)" in proc.stderr


def test_a_cuda_13_torch_without_the_meta_package_gets_it_at_its_cuda_release(tmp_path):
    proc, site, pip = run_script(tmp_path, "13.0", "-", CU13_FILES)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == f"{site}/nvidia/cu13\n"
    assert pip == ["install --quiet cuda-toolkit[nvcc,crt,cccl,cudart]==13.0.*"]


def test_a_cuda_12_torch_is_refused_naming_the_missing_compiler_and_the_fix(tmp_path):
    proc, _, pip = run_script(tmp_path, "12.8", "-", CU12_FILES)
    assert proc.returncode == 1
    assert pip == []  # nothing installed
    assert proc.stdout == ""
    assert "torch is built with CUDA 12.8, and PyPI's CUDA 12 wheels hold no compiler" in proc.stderr
    assert "cuda-toolkit-12-8" in proc.stderr and "HOROVOD_CUDA_HOME=/usr/local/cuda-12.8" in proc.stderr


def check_tree(home):
    """The script's own layout check, sourced, on ``home``."""
    return subprocess.run(
        ["bash", "-c", 'source "$0" && check_tree "$1"', str(SCRIPT), str(home)], capture_output=True, text=True
    )


def lay_out(root, files):
    for name in files.splitlines():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text("")


def test_the_layout_check_takes_the_cuda_13_tree_and_no_tree_of_the_cuda_12_wheels(tmp_path):
    lay_out(tmp_path, CU13_FILES + CU12_FILES)
    assert check_tree(tmp_path / "nvidia" / "cu13").returncode == 0
    for tree, missing in (("cuda_nvcc", "bin/nvcc"), ("cuda_runtime", "bin/nvcc")):
        proc = check_tree(tmp_path / "nvidia" / tree)
        assert proc.returncode == 1
        assert f"the toolkit wheels lack {missing} in {tmp_path}/nvidia/{tree}" in proc.stderr

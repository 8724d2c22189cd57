import subprocess
import sys


def test_import_hvdkit_loads_no_framework_and_no_horovod():
    code = (
        "import sys, hvdkit, hvdkit.core, hvdkit.launch, hvdkit.launch.plan, hvdkit.launch.execute, hvdkit.cli;"
        "print(sorted(m for m in ('torch', 'tensorflow', 'horovod', 'keras') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_hvdkit_torch_loads_horovod_torch():
    code = "import sys, hvdkit.torch; print('horovod.torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "True"

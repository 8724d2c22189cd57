import importlib
import pathlib
import subprocess
import sys


def _fresh_python(code):
    """What ``code`` prints in a new interpreter (nothing imported yet)."""
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()


def test_import_hvdkit_loads_no_framework_and_no_horovod():
    out = _fresh_python(
        "import sys, hvdkit, hvdkit.core, hvdkit.launch, hvdkit.launch.plan, hvdkit.launch.execute, hvdkit.cli;"
        "print(sorted(m for m in ('torch', 'tensorflow', 'horovod', 'keras') if m in sys.modules))"
    )
    assert out == "[]"


def test_hvdkit_torch_loads_horovod_torch():
    assert _fresh_python("import sys, hvdkit.torch; print('horovod.torch' in sys.modules)") == "True"


def test_job_spec_and_plan_load_the_timeline_flags_but_not_the_timeline_analyser():
    out = _fresh_python(
        "import sys, hvdkit.launch.spec, hvdkit.launch.plan;"
        "print(sorted(m for m in sys.modules if m.startswith('hvdkit.launch.timeline')))"
    )
    assert out == "['hvdkit.launch.timeline_flags']"


def test_tracking_and_timeline_are_split_into_modules_of_one_job_under_400_lines():
    from hvdkit.core import tracking
    from hvdkit.launch import timeline

    assert tracking.TensorBoardWriter.__module__ == "hvdkit.core.tensorboard_events"
    assert tracking.MlflowRun.__module__ == "hvdkit.core.mlflow_store"
    assert tracking.crc32c.__module__ == "hvdkit.core.tfrecord"
    assert timeline.timeline_path.__module__ == "hvdkit.launch.timeline_flags"
    split = ("core.tracking", "core.tfrecord", "core.tensorboard_events", "core.mlflow_store",
             "launch.timeline", "launch.timeline_flags", "launch.timeline_plot")
    lines = {m: len(pathlib.Path(importlib.import_module(f"hvdkit.{m}").__file__).read_text().splitlines())
             for m in split}
    assert max(lines.values()) <= 400, lines

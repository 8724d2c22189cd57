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


def test_job_spec_and_plan_load_the_timeline_flags_but_not_the_timeline_analyser():
    code = (
        "import sys, hvdkit.launch.spec, hvdkit.launch.plan;"
        "print(sorted(m for m in sys.modules if m.startswith('hvdkit.launch.timeline')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "['hvdkit.launch.timeline_flags']"


def test_tracking_and_timeline_are_split_into_modules_of_one_job_under_400_lines():
    from hvdkit.core import tracking
    from hvdkit.launch import timeline

    assert tracking.TensorBoardWriter.__module__ == "hvdkit.core.tensorboard_events"
    assert tracking.MlflowRun.__module__ == "hvdkit.core.mlflow_store"
    assert tracking.crc32c.__module__ == "hvdkit.core.tfrecord"
    assert timeline.timeline_path.__module__ == "hvdkit.launch.timeline_flags"
    split = [tracking, timeline] + [__import__(f"hvdkit.{m}", fromlist=["_"]) for m in (
        "core.tfrecord", "core.tensorboard_events", "core.mlflow_store", "launch.timeline_flags", "launch.timeline_plot")]
    lines = {m.__name__: sum(1 for _ in open(m.__file__)) for m in split}
    assert max(lines.values()) <= 400, lines

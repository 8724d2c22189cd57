import importlib
import pathlib
import subprocess
import sys


def _fresh_python(code):
    """What ``code`` prints in a new interpreter (nothing imported yet)."""
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()


def test_import_hvdkit_loads_no_framework_and_no_horovod():
    out = _fresh_python(
        "import sys, hvdkit, hvdkit.core, hvdkit.launcher, hvdkit.launcher.plan, hvdkit.launcher.execute, hvdkit.cli;"
        "print(sorted(m for m in ('torch', 'tensorflow', 'horovod', 'keras') if m in sys.modules))"
    )
    assert out == "[]"


def test_hvdkit_torch_loads_horovod_torch():
    assert _fresh_python("import sys, hvdkit.torch; print('horovod.torch' in sys.modules)") == "True"


def test_job_spec_and_plan_load_the_timeline_flags_but_not_the_timeline_analyser():
    out = _fresh_python(
        "import sys, hvdkit.launcher.spec, hvdkit.launcher.plan;"
        "print(sorted(m for m in sys.modules if 'timeline' in m))"
    )
    assert out == "['hvdkit.launcher.timeline_flags']"


def test_tracking_and_timeline_are_split_into_modules_of_one_job_under_400_lines():
    from hvdkit.core.monitoring import tracking
    from hvdkit.diagnostics import timeline

    assert tracking.TensorBoardWriter.__module__ == "hvdkit.core.monitoring.tensorboard_events"
    assert tracking.MlflowRun.__module__ == "hvdkit.core.monitoring.mlflow_store"
    assert tracking.crc32c.__module__ == "hvdkit.core.monitoring.tfrecord"
    assert timeline.timeline_path.__module__ == "hvdkit.launcher.timeline_flags"
    split = (
        "core.monitoring.tracking",
        "core.monitoring.tfrecord",
        "core.monitoring.tensorboard_events",
        "core.monitoring.mlflow_store",
        "diagnostics.timeline",
        "launcher.timeline_flags",
        "diagnostics.timeline_plot",
    )
    lines = {
        m: len(pathlib.Path(importlib.import_module(f"hvdkit.{m}").__file__).read_text().splitlines()) for m in split
    }
    assert max(lines.values()) <= 400, lines


def test_the_launcher_package_does_not_load_the_rank_wrapper_that_every_rank_runs_as_main():
    # `python -m hvdkit.launcher.rankwrap` imports the package first: a package that had loaded
    # rankwrap already makes Python warn on every rank (RuntimeWarning: found in sys.modules).
    out = _fresh_python(
        "import sys, hvdkit.launcher; from hvdkit.launcher import JobSpec;"
        "print(sorted(m for m in sys.modules if m.startswith('hvdkit.launcher.')))"
    )
    assert "hvdkit.launcher.rankwrap" not in out and "hvdkit.launcher.spec" in out, out

"""``hvdkit run`` and scripts written for Horovod's elastic mode (``@hvd.elastic.run``; issue 27, item 3).

``hvdkit run --min-np/--max-np`` is elastic by restarting the job from its checkpoints; a script
written with ``hvd.elastic.run`` expects Horovod's elastic driver (workers replaced in-process, state
from the last ``commit()``). ``--horovod-elastic`` hands such a job to that driver (horovodrun --gloo
in elastic mode, engine fixes 02/03/78); without it the engine stops the script at once with a
message naming the flag (engine fix 15-elastic-run-names-its-launcher; before: it ran silently as
a fixed-size job whose in-memory commits every hvdkit restart lost, training again from scratch).
Script: tests/engine/scripts/hvd_torch_elastic.py, Horovod's public API only.
"""

import json

import pytest
from elastic_jobs import clean_env, discovery
from helpers import HVDKIT, PYTHON, ROOT, run_bounded

pytestmark = pytest.mark.dist
SCRIPT = ROOT / "tests" / "engine" / "scripts" / "hvd_torch_elastic.py"
EXPECTED_TOTAL = 3 * sum(range(24))  # as in tests/engine/test_horovod_elastic_torch.py


def test_hvd_elastic_run_under_the_restart_launcher_stops_at_once_naming_horovod_elastic(tmp_path):
    script = discovery(tmp_path, "localhost:2\n")
    argv = [HVDKIT, "run", "-np", "2", "--min-np", "1", "--max-np", "2", "--host-discovery-script", str(script)]
    argv += ["--max-restarts", "0"]
    proc = run_bounded([*argv, "--", PYTHON, str(SCRIPT), str(tmp_path)], 180, env=clean_env(), cwd=tmp_path)
    text = proc.stdout + proc.stderr
    assert proc.returncode != 0, text[-3000:]
    assert "hvd.elastic.run needs Horovod's elastic driver" in text, text[-3000:]
    assert "Add --horovod-elastic to that `hvdkit run` line" in text
    assert not (tmp_path / "result.json").exists()  # nothing trained


def test_horovod_elastic_hands_the_job_to_horovods_driver_and_survives_a_removed_added_and_killed_worker(tmp_path):
    script = discovery(tmp_path, "localhost:1\n127.0.0.1:1\n")
    argv = [HVDKIT, "run", "-np", "2", "--min-np", "1", "--max-np", "2", "--host-discovery-script", str(script)]
    argv += ["--elastic-timeout", "60", "--horovod-elastic", "--", PYTHON, str(SCRIPT), str(tmp_path), "events"]
    proc = run_bounded(argv, 240, env=clean_env(), cwd=tmp_path)
    text = proc.stdout + proc.stderr
    assert proc.returncode == 0, text[-4000:]
    assert "Horovod's elastic driver runs this job (1..2 ranks)" in proc.stderr
    assert "attempt 2" not in text  # one job: no hvdkit restart
    for marker in ("removed", "added", "killed"):
        assert (tmp_path / marker).exists(), text[-4000:]
    assert (tmp_path / "resets").read_text().split() == ["1", "2", "1"]  # the same processes reset in place
    result = json.loads((tmp_path / "result.json").read_text())
    assert (result["total"], result["epochs"], result["size"]) == (EXPECTED_TOTAL, 3, 1)

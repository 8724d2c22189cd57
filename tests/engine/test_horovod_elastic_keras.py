"""Horovod elastic for Keras 3 (``hvd.elastic.KerasState``, ``@hvd.elastic.run`` and the Keras elastic
callbacks) runs unchanged on hvdkit's engine under ``horovodrun --gloo`` with a host discovery script
(issue 27, item 1): the events of the torch test, on a Keras ``fit``.

Upstream symptoms this test was written against (it failed on each before its engine fix):
- ``KerasState(model)`` raised ``TypeError: 'list' object is not callable`` (Keras 3's
  ``optimizer.variables`` is a list), and a worker that joined before its first step had no
  optimizer variables to receive (14-tf-elastic-keras3-optimizer-variables);
- after a reset in mid-epoch, ``fit`` trained the whole epoch again: Keras 3 ignores the
  ``params['steps']`` that ``UpdateBatchStateCallback`` shortened, and ``state.batch`` restarted at 0
  (45-keras3-elastic-resumes-mid-epoch).
Script: scripts/hvd_keras_elastic.py (Horovod's public API only); harness shared with the torch test
(support/elastic_jobs.py, scripts/elastic_hosts.py).
"""

import json

import pytest
from elastic_jobs import run_elastic
from helpers import ROOT

pytestmark = pytest.mark.dist
SCRIPT = ROOT / "tests" / "engine" / "scripts" / "hvd_keras_elastic.py"
EPOCHS, STEPS = 3, 6  # as in the script


def test_keras_state_resumes_from_the_last_commit_mid_epoch_through_a_removed_added_and_killed_worker(tmp_path):
    # A joining worker imports TensorFlow before it reaches Gloo's rendezvous: on a loaded 2-core
    # machine that took longer than Gloo's default 30 s wait (the survivor aborted: "Wait timeout").
    # The kill leaves its host out at once (engine fix 09 would otherwise start a new worker there).
    slow_start = {"HOROVOD_GLOO_TIMEOUT_SECONDS": "120", "HOROVOD_ELASTIC_HOST_FAILURES": "1"}
    proc = run_elastic(SCRIPT, tmp_path, "localhost:1\n127.0.0.1:1\n", 2, 1, 2, ["events"], 400, env=slow_start)
    text = proc.stdout + proc.stderr
    assert proc.returncode == 0, text[-4000:]
    for marker in ("removed", "added", "killed"):  # every event happened
        assert (tmp_path / marker).exists(), text[-4000:]
    assert [json.loads(line)["size"] for line in (tmp_path / "resets").read_text().splitlines()] == [1, 2, 1]
    # Each batch of each epoch trained exactly once: the optimizer's step count (restored with its
    # state) is that of an uninterrupted run; before the fix every restart trained its epoch again.
    result = json.loads((tmp_path / "result.json").read_text())
    assert result == {"epoch": EPOCHS, "batch": 0, "iterations": EPOCHS * STEPS, "size": 1}
    log = [json.loads(line) for line in (tmp_path / "log").read_text().splitlines()]
    starts, last = [], None
    for entry in log:
        if entry["event"] == "commit":
            last = entry
        elif last is not None:  # a restart: every rank holds exactly what the last commit saved
            starts.append(entry)
            for key in ("epoch", "batch", "weights", "optimizer"):
                assert entry[key] == last[key], (key, entry, last)
    assert [s["size"] for s in starts] == [1, 2, 2, 1], starts  # removed; added (both ranks); killed
    assert any(s["batch"] > 0 for s in starts), starts  # at least one restart in mid-epoch
    assert len(starts[0]["optimizer"]) > 1 and starts[0]["optimizer"][0] > 0  # momentum and step count came back
    kept = "localhost" if (tmp_path / "removed_host").read_text() == "127.0.0.1" else "127.0.0.1"  # rank 0's host
    final = json.loads((tmp_path / f"weights-{kept}.json").read_text())
    assert final == last["weights"] != starts[0]["weights"]  # it trained on after the last restart
    assert "DONE 0 1" in proc.stdout

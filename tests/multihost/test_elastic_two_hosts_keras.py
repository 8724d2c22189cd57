"""Elastic training by restart on two real hosts with the Keras example (``model.fit``, epoch
granularity): the torch test of test_elastic_two_hosts.py, done for Keras.

`hvdkit run -np 2 --min-np 1 --max-np 2` trains examples/keras_digits.py across hosts a and b with
the global batch kept constant and no compression. Host b dies mid-epoch (link down, processes
killed): the job relaunches on a alone, which resumes at the newest epoch checkpoint; b comes back:
the launcher asks a to stop, which it does at its next epoch end (the Keras example checks its
PreemptionGuard there only), and the job grows back to 2 and finishes. It ends within 1e-5 of an
uninterrupted 2-rank run, and the per-sample logs show every sample used exactly once per epoch.
Needs root (namespaces, mounts).
"""

import json
import os
import shutil
import time

import numpy as np
import pytest

from helpers import PYTHON, ROOT, hvdkit_run, record_figures
from netns import NIC, TwoHosts
from test_elastic_two_hosts import GROW_ASKED, Job, Paused, _changes, _effective_steps, _epochs, _lines, discovery_script, kill_host, set_link

pytestmark = [
    pytest.mark.dist,
    pytest.mark.timeout(900),
    pytest.mark.skipif(os.geteuid() != 0, reason="network namespaces and mounts need root"),
    pytest.mark.skipif(not (shutil.which("ip") and os.path.exists("/usr/sbin/sshd")), reason="needs iproute2 and openssh-server (make setup installs them)"),
]
EXAMPLE = str(ROOT / "examples" / "keras_digits.py")
# 45 steps an epoch: long enough for b to die mid-epoch, not only at an epoch end
EPOCHS = 4  # b dies in epoch 2; a alone, held until the launcher asks it to stop, ends that epoch; the last run at 2 again
TRAIN = [PYTHON, EXAMPLE, "--epochs", str(EPOCHS), "--batch-size", "16", "--global-batch-size", "32", "--compression", "none"]
SAME_THREADS = ["-x", "HVDKIT_NUM_THREADS=1"]


@pytest.fixture(scope="module")
def hosts():
    two = TwoHosts(prefix="hvdq")  # names of its own, apart from the torch test's "hvde" hosts
    try:
        yield two.open()
    finally:
        two.close()
    assert two.leftovers() == []


def final_weights(folder):
    """The model weights of the newest checkpoint in ``folder``, by position (``model/<i>``)."""
    from hvdkit.core.checkpointer import read_newest

    return {f"model/{i}": a for i, a in enumerate(read_newest(folder).state["model"])}


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    work = tmp_path_factory.mktemp("uninterrupted-keras")
    proc = hvdkit_run("-np", "2", *SAME_THREADS, "--", *TRAIN, "--checkpoint-dir", str(work / "c"), "--sample-log", str(work / "s"),
                      timeout=500)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    return work


@pytest.fixture(scope="module")
def elastic(hosts, tmp_path_factory):
    """The shrink-and-grow job: b dies in epoch 2 and comes back as soon as the job is relaunched on a alone."""
    work = tmp_path_factory.mktemp("elastic-keras")
    a, b = hosts.names
    script = discovery_script(work, f"{a}:1\n{b}:1\n")  # b stays listed: ssh decides that it is gone
    args = ["-np", "2", "--min-np", "1", "--max-np", "2", "--host-discovery-script", script, "--discovery-interval", "0.3",
            "--network-interface", NIC, *SAME_THREADS, "--", *TRAIN, "--checkpoint-dir", str(work / "c"),
            "--sample-log", str(work / "s")]  # fmt: skip
    job = Job(hosts, work, args)
    started = time.monotonic()
    try:
        job.wait_for(lambda: any(r["epoch"] >= 1 for r in _lines(work / "s.rank1")[-1:]), "rank 1 training in epoch 2")
        set_link(hosts, 1, False)  # first: nothing b's dying processes send reaches a, as in a crash
        assert kill_host(hosts, 1)
        job.wait_for(lambda: "attempt 2: 1 rank(s)" in job.text(), "a relaunch on host a alone")
        set_link(hosts, 1, True)  # b is back at once: the launcher asks to grow only once a alone trains
        # the example reports its steps from fit's start (PreemptionGuard.progress): the launcher
        # asks as soon as a alone trains, and a stops at the end of that epoch
        job.wait_for(lambda: any(r["size"] == 1 for r in _lines(work / "s.rank0")), "training on a alone", poll=0.01)
        with Paused(hosts, 0, EXAMPLE):  # a alone must not finish before the launcher asks it to stop
            job.wait_for(lambda: GROW_ASKED in job.text(), "the request to grow", timeout=120)
        code = job.finish()
    finally:
        set_link(hosts, 1, True)
        job.kill()
    return {"work": work, "code": code, "log": job.text(), "seconds": time.monotonic() - started}


def test_the_keras_job_shrinks_to_host_a_when_b_dies_and_grows_back_when_b_returns(elastic):
    log = elastic["log"]
    assert elastic["code"] == 0, log[-4000:]
    assert "elastic summary: 3 attempt(s), world size 2 -> 1 -> 2" in log, log[-4000:]
    assert "shrink 2 -> 1 (failed)" in log and "grow 1 -> 2 (stopped to grow)" in log
    result = [json.loads(line.split("] ", 1)[1]) for line in log.splitlines() if line.startswith("[rank 0] {")]
    assert result[-1]["world_size"] == 2 and not result[-1]["preempted"] and result[-1]["epochs"] == EPOCHS
    assert 0 < result[-1]["resumed_from_epoch"] < EPOCHS  # the last attempt resumed at an epoch boundary


def test_every_sample_is_used_exactly_once_per_epoch_across_the_keras_changes(elastic, uninterrupted):
    steps, recomputed = _effective_steps(elastic["work"])
    reference, _ = _effective_steps(uninterrupted)
    assert sorted(steps) == sorted(reference) == list(range(1, len(reference) + 1))
    epochs, expected = _epochs(steps), _epochs(reference)
    assert sorted(epochs) == list(range(EPOCHS))
    for epoch, used in epochs.items():
        assert max(used.values()) == 1, f"epoch {epoch}: samples used twice"
        assert used == expected[epoch], f"epoch {epoch}: other samples than the uninterrupted run"
    sizes = {records[0]["epoch"]: records[0]["size"] for _, records in sorted(steps.items())}
    per_epoch = {}
    for _, records in steps.items():  # epoch granularity: one world size for all of an epoch's steps
        per_epoch.setdefault(records[0]["epoch"], set()).add(records[0]["size"])
    assert all(len(s) == 1 for s in per_epoch.values()), per_epoch
    assert 1 in sizes.values() and sizes[0] == sizes[EPOCHS - 1] == 2, sizes
    assert recomputed > 0  # b died mid-epoch: a alone trained again the steps of the epoch it was in
    figures = {c["kind"]: c for c in _changes(elastic["log"])}
    # the summary counts the steps of the epoch b died in (reported at each batch end) as redone;
    # the grow stops at an epoch end, where the checkpoint is: nothing redone
    assert figures["grow"]["recomputed"] == 0 and 0 < figures["shrink"]["recomputed"] <= recomputed, (figures, recomputed)
    record_figures(
        "elastic: host b dies mid-epoch, comes back (keras fit, 2 hosts, min 1 max 2)",
        shrink_seconds_noticed_to_running=figures["shrink"]["seconds"],
        grow_seconds_noticed_to_running=figures["grow"]["seconds"],
        grow_seconds_for_the_old_ranks_to_stop=figures["grow"]["stopping"],
        steps_recomputed_total=recomputed,
        world_size_per_epoch=[sizes[e] for e in range(EPOCHS)],
        job_seconds=round(elastic["seconds"], 1),
    )


def test_the_final_keras_weights_match_an_uninterrupted_two_rank_run(elastic, uninterrupted):
    got, want = final_weights(elastic["work"] / "c"), final_weights(uninterrupted / "c")
    assert sorted(got) == sorted(want) and want
    worst = max(float(np.max(np.abs(got[k] - want[k]))) for k in want)
    record_figures("elastic keras: final weights against an uninterrupted run", max_abs_difference=worst)
    assert worst <= 1e-5, worst

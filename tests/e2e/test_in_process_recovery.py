"""In-process recovery (`hvdkit run --recovery in-process`): a worker killed mid-run, the job goes on in the
processes that are left, from their last in-memory commit, with the maths of an uninterrupted run.

Real ranks: Horovod's elastic driver over Gloo, the unchanged Trainer example (examples/torch_digits.py,
global batch 64 so that the maths does not depend on the world size), one host (`localhost:2`; engine
fix 09 replaces a lost worker there). Each job is bounded in time and leaves no process behind.
"""

import json
import re
import signal

import numpy as np
import pytest
from elastic_jobs import assert_every_sample_once_per_epoch as assert_samples_once
from elastic_jobs import last_generation
from helpers import PYTHON, hvdkit_run, pid_running, read_sample_logs

from hvdkit.core.checkpoint.lock import LOCK_FILE
from hvdkit.core.checkpoint.state import read_newest

pytestmark = pytest.mark.dist
TORCH = "examples/torch_digits.py"
KILL = "tests/e2e/scripts/kill_in_process.py"
LOOP = "tests/e2e/scripts/elastic_loop.py"
EPOCHS = 3
TRAIN_SAMPLES = 1437
STEPS_PER_EPOCH = 23  # global batch 64
ARGS = ("--epochs", str(EPOCHS), "--global-batch-size", "64", "--compression", "none")
BOUND = 1e-5  # the bound a restart at another world size holds (tests/distributed/test_world_size_change_torch.py)
IN_PROCESS = ("-np", "2", "--min-np", "1", "--max-np", "2", "--recovery", "in-process")


def final_line(out):
    """The example's JSON result line: printed by whichever process is rank 0 at the end."""
    lines = [line[line.index("{") :] for line in out.splitlines() if '{"preempted"' in line]
    assert len(lines) == 1, out[-3000:]
    return json.loads(lines[0])


def params(ckpt_dir):
    return read_newest(ckpt_dir).state["model"]


def assert_close(a, b, bound):
    assert sorted(a) == sorted(b)
    worst = max(float(np.max(np.abs(a[k].astype(np.float64) - b[k].astype(np.float64)))) for k in a)
    assert worst <= bound, f"largest difference {worst:g} > {bound:g}"
    return worst


def assert_every_sample_once_per_epoch(records):
    assert_samples_once(records, EPOCHS, TRAIN_SAMPLES, STEPS_PER_EPOCH)


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    """The same training on 2 ranks, uninterrupted, by the restart path: the reference."""
    d = tmp_path_factory.mktemp("ref") / "ckpt"
    proc = hvdkit_run("-np", "2", "--gloo", "--", PYTHON, TORCH, *ARGS, "--checkpoint-dir", str(d), timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return {"params": params(d), "result": final_line(proc.stdout)}


@pytest.mark.parametrize(
    "rank, where, shard",
    [
        (1, "step:30", False),  # mid-epoch 2
        (0, "step:30", False),  # rank 0: the rank left becomes rank 0 and goes on checkpointing
        (1, "commit:4", False),  # inside a commit: the survivor goes on from the newest commit it holds
        # ZeRO-1 across the shrink: each commit gathers the state; the survivor cuts it for 1 rank. Its maths is the
        # unsharded one, so the reference is the same uninterrupted run
        (1, "step:30", True),
    ],
    ids=["rank1-step30", "rank0-step30", "rank1-commit4", "zero1-rank1-step30"],
)
def test_a_worker_killed_mid_run_is_recovered_in_process_with_every_sample_once_and_the_uninterrupted_result(
    uninterrupted, tmp_path, rank, where, shard
):
    d, log = tmp_path / "ckpt", tmp_path / "samples"
    proc = hvdkit_run(
        *IN_PROCESS,
        "--",
        PYTHON,
        KILL,
        str(tmp_path / "killed"),
        str(rank),
        where,
        TORCH,
        *ARGS,
        "--checkpoint-dir",
        str(d),
        "--sample-log",
        str(log),
        *(("--shard-optimizer-state",) if shard else ()),
        timeout=300,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-5000:]
    assert (tmp_path / "killed").exists()  # the kill happened
    if where.startswith("step"):  # the killed rank stepped its ZeRO-1 slice only: half the values at 2 ranks
        (held,) = map(int, re.findall(r"the optimizer steps (\d+) parameter values", out))
        assert held == sum(v.size for v in uninterrupted["params"].values()) // (2 if shard else 1)
    lost = re.findall(r"a worker was lost: 2 -> 1 ranks, going on from step (\d+) \(committed in memory\)", out)
    assert len(lost) == 1, out[-5000:]
    assert "restarting" not in out and out.count("2 rank(s) over Gloo") == 1  # no relaunch of the job
    result = final_line(out)
    assert result["steps"] == EPOCHS * STEPS_PER_EPOCH
    # the checkpoints go on after the loss of either rank: the last is the end of the run
    assert read_newest(d).step == EPOCHS * STEPS_PER_EPOCH
    # the lock's holder names the job's lineage: a new rank 0 of this job waits for the old one to give it back
    assert re.fullmatch(r"[0-9a-f]{16}", json.loads((d / LOCK_FILE).read_text())["lineage"])
    assert_every_sample_once_per_epoch(read_sample_logs(log))
    assert_close(params(d), uninterrupted["params"], BOUND)
    # validated over every sample at the new size too (before: the shards of the old size, half the set)
    assert abs(result["val_loss"] - uninterrupted["result"]["val_loss"]) <= 1e-4
    assert result["val_accuracy"] == uninterrupted["result"]["val_accuracy"]


def test_sigterm_to_hvdkit_run_stops_every_rank_at_a_checkpointed_step_and_the_next_in_process_start_continues(
    uninterrupted, tmp_path
):
    """Preemption as Kubernetes does it (SIGTERM to the container's main process, `hvdkit run`; then SIGKILL after
    terminationGracePeriodSeconds, 30 s by default): at rank 1's step 26 (epoch 2) the kill wrapper sends SIGTERM to
    the job's `hvdkit run`. Every rank must hear of it at once (the Trainer's PreemptionGuard: they stop after the
    same step, rank 0 checkpoints it), exit 0, the job exit 143 and leave no process. Before, `hvdkit run` passed
    nothing to the ranks of Horovod's elastic driver for its whole grace period (30 s): this run ended unstopped."""
    d, log = tmp_path / "ckpt", tmp_path / "samples"
    proc = hvdkit_run(
        *IN_PROCESS, "--", PYTHON, KILL, str(tmp_path / "termed"), "1", "term:26,pace:0.1", TORCH, *ARGS,
        "--checkpoint-dir", str(d), "--sample-log", str(log), timeout=300,
    )  # fmt: skip
    out = proc.stdout + proc.stderr
    assert (tmp_path / "termed").exists()  # the signal was sent
    assert proc.returncode == 128 + signal.SIGTERM, out[-5000:]
    assert "stopped by SIGTERM: every rank exited cleanly" in out, out[-5000:]
    stopped = final_line(out)
    assert stopped["preempted"] is True, out[-5000:]
    # stopped in epoch 2 (steps 24-46), at the step rank 0 checkpointed: a step a pace of 0.1 s follows the signal
    step = stopped["steps"]
    assert 26 <= step < 2 * STEPS_PER_EPOCH and read_newest(d).step == step, out[-5000:]
    assert "a worker was lost" not in out and out.count("2 rank(s) over Gloo") == 1  # nothing taken for a failure
    # every process of the job (each worker says its pid; the wrapper listed the job's processes at the signal)
    (listed,) = re.findall(r"kill_in_process: SIGTERM to hvdkit run \d+; below it: ([\d ]+)$", out, re.M)
    workers = [int(p) for p in re.findall(r"kill_in_process: process (\d+) runs", out)]
    assert len(workers) == 2 and set(workers) <= {int(p) for p in listed.split()}, out[-5000:]
    assert [p for p in map(int, listed.split()) if pid_running(p)] == []
    # the next start, in-process again, continues from that step and ends as the uninterrupted run
    again = hvdkit_run(
        *IN_PROCESS, "--", PYTHON, TORCH, *ARGS, "--checkpoint-dir", str(d), "--sample-log", str(log), timeout=300
    )
    out = again.stdout + again.stderr
    assert again.returncode == 0, out[-5000:]
    result = final_line(out)
    assert result["resumed_from_epoch"] == 1 and result["steps"] == EPOCHS * STEPS_PER_EPOCH
    assert_every_sample_once_per_epoch(read_sample_logs(log))
    assert_close(params(d), uninterrupted["params"], BOUND)
    assert abs(result["val_loss"] - uninterrupted["result"]["val_loss"]) <= 1e-4


def test_a_sigterm_while_the_ring_forms_again_stops_the_survivor_at_a_checkpointed_step_after_it(tmp_path):
    """Rank 1 is killed at step 30; while the survivor forms the ring again (between the guard of the training the
    loss ended and the guard of the training that goes on), the job is preempted: SIGTERM to `hvdkit run`, which
    passes it on at once. The survivor must finish the reset, stop at its first check and checkpoint that step, so
    that the next start loses nothing. Before, SIGTERM's default action ended it in the reset: the job exited 137,
    the steps since the last checkpoint were lost and no result line was printed."""
    d = tmp_path / "ckpt"
    proc = hvdkit_run(
        *IN_PROCESS, "--", PYTHON, KILL, str(tmp_path / "killed"), "1", "step:30,term-at-reset", TORCH, *ARGS,
        "--checkpoint-dir", str(d), timeout=300,
    )  # fmt: skip
    out = proc.stdout + proc.stderr
    assert (tmp_path / "killed").exists() and (tmp_path / "killed.term").exists()  # the kill, then the signal
    assert proc.returncode == 128 + signal.SIGTERM, out[-5000:]
    stopped = final_line(out)
    assert stopped["preempted"] is True and stopped["world_size"] == 1, out[-5000:]
    (resumed,) = map(int, re.findall(r"a worker was lost: 2 -> 1 ranks, going on from step (\d+)", out))
    # its first check, checkpointed: the next start goes on from there (as the SIGTERM test above shows)
    assert stopped["steps"] == resumed + 1 and read_newest(d).step == resumed + 1, out[-5000:]


def test_a_new_worker_joins_after_the_loss_and_the_run_ends_as_without_the_kill(uninterrupted, tmp_path):
    """The lost worker's slot gets a new process (engine fix 09), which joins at a commit: its script builds
    the Trainer (and its Checkpointer) while the others wait in the sync, so nothing collective may run
    there (before: the Checkpointer's preflight broadcast met the sync's allgather and the job hung)."""
    d, log = tmp_path / "ckpt", tmp_path / "samples"
    proc = hvdkit_run(
        *IN_PROCESS, "--", PYTHON, KILL, str(tmp_path / "killed"), "1", "step:10,hold-for-join,pace:0.25", TORCH, *ARGS,
        "--checkpoint-dir", str(d), "--sample-log", str(log), timeout=600,
    )  # fmt: skip
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-5000:]
    # one recovery and one join, nothing else: before, the new worker took the update it joined by for a new one
    # at the next commit and reset alone, and the others went through a recovery nobody caused ("2 -> 2 ranks")
    assert re.findall(r"(a worker was lost|workers join): (\d+ -> \d+) ranks", out) == [
        ("a worker was lost", "2 -> 1"),
        ("workers join", "1 -> 2"),
    ], out[-5000:]
    # every process's output reaches the job's, the joining worker's too (started on standby, engine fix 16)
    started = re.findall(r"^\[rank (\d)\] kill_in_process: process (\d+) runs", out, re.M)
    assert sorted(r for r, _ in started) == ["0", "1", "1"] and len({p for _, p in started}) == 3, out[-5000:]
    records = read_sample_logs(log)
    assert {r["size"] for r in last_generation(records).values() for r in r} == {1, 2}  # trained at both sizes
    assert_every_sample_once_per_epoch(records)
    result = final_line(out)
    assert result["steps"] == EPOCHS * STEPS_PER_EPOCH and result["world_size"] == 2
    assert_close(params(d), uninterrupted["params"], BOUND)
    assert abs(result["val_loss"] - uninterrupted["result"]["val_loss"]) <= 1e-4


def test_a_script_that_trains_outside_hk_elastic_run_stops_at_once_naming_the_fix(tmp_path):
    script = tmp_path / "plain_loop.py"
    script.write_text(
        "import torch\nimport hvdkit.torch as hk\nhk.init()\n"
        "model = torch.nn.Linear(2, 1)\n"
        "opt = hk.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), model=model)\n"
        "model(torch.ones(4, 2)).sum().backward()\nopt.step()\n"
    )
    proc = hvdkit_run(*IN_PROCESS, "--", PYTHON, str(script), timeout=180)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert "the optimizer's step() was called outside hk.elastic.run" in out, out[-3000:]
    assert "--recovery restart" in out


def test_in_process_needs_the_elastic_bounds_and_refuses_restart_flags():
    proc = hvdkit_run("-np", "2", "--recovery", "in-process", "--", PYTHON, TORCH, timeout=60)
    assert proc.returncode == 2 and "--recovery in-process runs Horovod's elastic driver" in proc.stderr
    proc = hvdkit_run(*IN_PROCESS, "--max-restarts", "3", "--", PYTHON, TORCH, timeout=60)
    assert proc.returncode == 2 and "--max-restarts (or HVDKIT_MAX_RESTARTS) does not apply with --recovery" in (
        proc.stderr
    )


def test_the_dry_run_is_one_elastic_horovodrun_job_over_gloo_with_a_discovery_script_for_one_host():
    proc = hvdkit_run(*IN_PROCESS, "--dry-run", "--", PYTHON, TORCH, timeout=60)
    assert proc.returncode == 0, proc.stderr
    argv = proc.stdout.split()
    assert argv[1:7] == ["-np", "2", "--min-np", "1", "--max-np", "2"] and "--gloo" in argv
    assert "--host-discovery-script" in argv and "-H" not in argv  # horovodrun refuses one -H host when elastic
    # a host left out comes back after a cooldown (Horovod's default: never), so a re-listed host can rejoin
    i = argv.index("--blacklist-cooldown-range")
    assert argv[i + 1 : i + 3] == ["1", "60"]


@pytest.fixture(scope="module")
def loop_reference(tmp_path_factory):
    """The hand-written loop on 2 ranks, uninterrupted. Outside --recovery in-process the same script is a plain
    job: hk.elastic.run calls the loop once."""
    ref = tmp_path_factory.mktemp("loop") / "ref.npz"
    proc = hvdkit_run("-np", "2", "--gloo", "--", PYTHON, LOOP, str(ref), timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return ref


@pytest.mark.parametrize("shard", [False, True], ids=["plain", "zero1"])
def test_a_hand_written_loop_under_hk_elastic_run_recovers_a_killed_worker_and_ends_as_without_the_kill(
    loop_reference, tmp_path, shard
):
    out_file, log = tmp_path / "out.npz", tmp_path / "samples"
    proc = hvdkit_run(
        *IN_PROCESS, "--", PYTHON, KILL, str(tmp_path / "killed"), "1", "step:30", LOOP, str(out_file),
        "--sample-log", str(log), *(("--shard",) if shard else ()), timeout=300,
    )  # fmt: skip
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-5000:]
    assert len(re.findall(r"a worker was lost: 2 -> 1 ranks, going on from step \d+", out)) == 1, out[-5000:]
    result = final_line(out.replace('{"steps"', '{"preempted": null, "steps"'))
    assert result["steps"] == EPOCHS * STEPS_PER_EPOCH and result["recoveries"] >= 1
    assert_every_sample_once_per_epoch(read_sample_logs(log))
    # ZeRO-1 across the shrink: the slices are cut anew at 1 rank from the commit; the same maths as unsharded
    a, b = np.load(out_file), np.load(loop_reference)
    assert_close({k: a[k] for k in a.files}, {k: b[k] for k in b.files}, BOUND)


def test_a_worker_lost_while_the_ring_forms_again_is_a_failed_reset_the_survivor_tries_again(
    uninterrupted, tmp_path, monkeypatch
):
    """Rank 1 is killed; the worker that takes its slot dies as soon as the rendezvous took it, while the survivor
    forms the ring with it (inside hvd.init). The survivor's Gloo rendezvous then fails (here: the dead worker never
    gives its address, Gloo's timeout; or a connection closed by it); engine fix 17 makes that a failed hvd.init that
    the loop tries again, without the dead worker. Before it, Gloo's IoException escaped Horovod's background thread
    and aborted the survivor (`terminate called after throwing an instance of 'gloo::IoException'`): the job was lost.
    """
    monkeypatch.setenv("HOROVOD_GLOO_TIMEOUT_SECONDS", "25")  # how long the survivor waits for the dead worker
    d, log = tmp_path / "ckpt", tmp_path / "samples"
    proc = hvdkit_run(
        *IN_PROCESS, "--", PYTHON, KILL, str(tmp_path / "killed"), "1", "step:10,join,pace:0.25", TORCH, *ARGS,
        "--checkpoint-dir", str(d), "--sample-log", str(log), timeout=400,
    )  # fmt: skip
    out = proc.stdout + proc.stderr
    assert "terminate called" not in out, out[-5000:]
    assert proc.returncode == 0, out[-5000:]
    assert (tmp_path / "killed").exists() and (tmp_path / "killed.join").exists()  # both kills happened
    assert len(re.findall(r"a worker was lost while the ring formed again \(.*\); trying again \(1 of 5\)", out)) == 1
    assert out.count("2 rank(s) over Gloo") == 1  # the survivor went on: the job never started anew
    result = final_line(out)
    assert result["steps"] == EPOCHS * STEPS_PER_EPOCH
    assert_every_sample_once_per_epoch(read_sample_logs(log))
    assert_close(params(d), uninterrupted["params"], BOUND)

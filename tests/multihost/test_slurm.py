"""A real SLURM (Debian's slurm-wlm 22.05 and munge): a controller and two slurmd nodes, one per host.

`hvdkit render slurm` output goes to `sbatch` unchanged (only the command after `--` is the test's)
and `hvdkit run` inside the allocation trains the torch digits example across both nodes; srun with
PMIx starts the ranks itself; `scancel` and `scontrol requeue` stop a job through the preemption
path (SLURM sends SIGTERM) and the requeued job resumes from the checkpoint. Results are compared
with a one-host 2-rank run with one thread per rank (as in test_two_hosts.py). The nodes refuse ssh
(no keys for them): everything reaches the other node through SLURM. Needs root.
"""

import json
import os
import re
import subprocess
from datetime import datetime

import pytest
import torch
from helpers import BIN, HVDKIT, PYTHON, ROOT, hvdkit_run, result_line
from slurm import NEEDS_SLURM, SlurmCluster  # tests/multihost is on sys.path

pytestmark = NEEDS_SLURM
EXAMPLE = str(ROOT / "examples" / "torch_digits.py")
EPOCHS = 10
STEPS_PER_EPOCH = 23  # 1,437 training images, 2 ranks x 32
ARGS = ("--epochs", str(EPOCHS), "--compression", "none")  # fixed: 'auto' picks by timing
JOB_ENV = {"HVDKIT_NUM_THREADS": "1"}  # sbatch passes the submitter's environment to the job (--export=ALL)


@pytest.fixture(scope="module")
def cluster():
    c = SlurmCluster()
    try:
        yield c.open()
    finally:
        c.close()
    assert c.leftovers() == []  # no daemon, namespace or folder survives the tests


@pytest.fixture(scope="module")
def one_host(tmp_path_factory):
    """The same training as one 2-rank job on this host: its result line and final parameters."""
    d = tmp_path_factory.mktemp("one") / "c"
    proc = hvdkit_run(
        "-np", "2", "-x", "HVDKIT_NUM_THREADS=1", "--", PYTHON, EXAMPLE, *ARGS, "--checkpoint-dir", str(d)
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return result_line(proc.stdout), params(d)


def newest(ckpt_dir):
    return sorted(p for p in os.listdir(ckpt_dir) if p.startswith("ckpt-"))[-1]


def params(ckpt_dir):
    """The model tensors of the newest checkpoint in ``ckpt_dir``, by state-dict key (the public reader)."""
    from hvdkit.core.checkpoint.state import read_newest

    return {k: torch.from_numpy(a) for k, a in read_newest(ckpt_dir).state["model"].items()}


def assert_same_params(a, b):
    assert sorted(a) == sorted(b)
    for key in a:
        assert torch.equal(a[key], b[key]), key


def render_job(folder, checkpoints):
    """``hvdkit render slurm`` for 2 nodes x 1 rank, written unchanged to FOLDER/job.sbatch."""
    argv = [
        HVDKIT,
        "render",
        "slurm",
        "--name",
        "hvdkit-slurm-test",
        "-np",
        "2",
        "--nodes",
        "2",
        "--slots-per-node",
        "1",
        "--cpu",
        "1",
        "--memory",
        "512Mi",
        "--",
        PYTHON,
        EXAMPLE,
        *ARGS,
        "--checkpoint-dir",
        str(checkpoints),
    ]
    text = subprocess.run(argv, capture_output=True, text=True, check=True).stdout
    path = folder / "job.sbatch"
    path.write_text(text)
    return path


def sbatch(cluster, folder, *options, timeout=60):
    """Submit FOLDER/job.sbatch from host a (output FOLDER/job.out); ``(exit code, job id)``."""
    env = {"PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}", **JOB_ENV}
    argv = [
        "sh",
        "-c",
        'cd "$0" && exec sbatch --parsable "$@" job.sbatch',
        str(folder),
        f"--output={folder / 'job.out'}",
        *options,
    ]
    p = cluster.run(0, argv, check=False, timeout=timeout, env=env)
    assert p.returncode == 0 or "--wait" in options, p.stdout + p.stderr
    return p.returncode, p.stdout.strip().splitlines()[0]


def wait_for_checkpoint(cluster, ckpt_dir, job_id, timeout=300):
    """Wait until the job has saved its first checkpoint (it is then well inside its training)."""
    import time

    deadline = time.monotonic() + timeout
    while not (ckpt_dir.exists() and any(p.startswith("ckpt-") for p in os.listdir(ckpt_dir))):
        state = cluster.job(job_id).get("JobState")
        assert state in ("PENDING", "RUNNING") and time.monotonic() < deadline, f"job {state}:\n{cluster.logs()}"
        time.sleep(0.2)


def result_lines(text):
    """Every result line of the example in a job's output (one per run of the batch script)."""
    return [json.loads(line.split("] ", 1)[1]) for line in text.splitlines() if line.startswith("[rank 0] {")]


def step_ended(cluster, node, step):
    """When slurmd on ``node`` logged that the job step ``step`` (e.g. ``7.batch``) was done."""
    m = re.search(rf"^\[([0-9T:.-]+)\] \[{re.escape(step)}\] done with job", cluster.logs(f"slurmd-{node}"), re.M)
    assert m, cluster.logs(f"slurmd-{node}")
    return datetime.fromisoformat(m.group(1)).timestamp()


def test_both_nodes_register_with_the_controller_under_their_own_names(cluster):
    out = cluster.run(1, ["scontrol", "-o", "show", "nodes"]).stdout  # asked from host b
    for name, address in zip(cluster.nodes, cluster.hosts.addresses):
        assert re.search(rf"NodeName={name} .*NodeAddr={address} .*State=IDLE", out), out
    hostnames = cluster.run(0, ["srun", "-N", "2", "-n", "2", "hostname"]).stdout.split()
    assert sorted(hostnames) == sorted(cluster.nodes)


def test_rendered_batch_script_trains_across_both_nodes_and_ends_where_one_host_ends(cluster, one_host):
    folder = cluster.folder("render")
    script = render_job(folder, folder / "c")
    code, job_id = sbatch(cluster, folder, "--wait", timeout=400)
    out = (folder / "job.out").read_text()
    assert code == 0, out[-4000:] + cluster.logs()
    assert "2 rank(s) over MPI" in out and "1 thread(s) per rank" in out
    assert f"[{job_id}.0] done with job" in cluster.logs(f"slurmd-{cluster.nodes[1]}")  # mpirun's daemon on b, by srun
    r = result_line(out)
    reference, reference_params = one_host
    assert r["world_size"] == 2 and r["steps"] == EPOCHS * STEPS_PER_EPOCH
    assert (r["val_accuracy"], r["val_loss"]) == (reference["val_accuracy"], reference["val_loss"])
    assert_same_params(params(folder / "c"), reference_params)
    assert script.read_text().count("\n#SBATCH") == 6  # the file went in as rendered


def test_srun_with_pmix_starts_the_ranks_itself_and_ends_where_one_host_ends(cluster, one_host):
    folder = cluster.folder("pmix")
    env = {"PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}", **JOB_ENV}
    p = cluster.run(
        0,
        ["srun", "--mpi=pmix", "-N", "2", "-n", "2", PYTHON, EXAMPLE, *ARGS, "--checkpoint-dir", str(folder / "c")],
        check=False,
        timeout=400,
        env=env,
    )
    assert p.returncode == 0, p.stderr[-4000:]
    r = json.loads(p.stdout.strip().splitlines()[-1])  # srun does not tag lines; only rank 0 prints it
    reference, reference_params = one_host
    assert r["world_size"] == 2
    assert (r["val_accuracy"], r["val_loss"]) == (reference["val_accuracy"], reference["val_loss"])
    assert_same_params(params(folder / "c"), reference_params)


def test_srun_with_pmi2_cannot_start_debians_open_mpi_which_lacks_slurms_pmi(cluster):
    listed = cluster.run(0, ["srun", "--mpi=list"]).stdout + cluster.run(0, ["srun", "--mpi=list"]).stderr
    assert "pmix" in listed and "pmi2" in listed  # Debian's SLURM offers both
    env = {"PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}"}
    p = cluster.run(
        0,
        ["srun", "--mpi=pmi2", "-N", "2", "-n", "2", PYTHON, "-c", "from mpi4py import MPI"],
        check=False,
        timeout=120,
        env=env,
    )
    assert p.returncode != 0
    assert "OMPI was not built with SLURM's PMI support" in p.stdout + p.stderr


def test_scancel_checkpoints_the_step_it_stopped_at_before_slurm_ends_the_batch_step(cluster):
    from hvdkit.core.checkpoint import verify

    folder = cluster.folder("scancel")
    render_job(folder, folder / "c")
    _, job_id = sbatch(cluster, folder)
    wait_for_checkpoint(cluster, folder / "c", job_id)
    cluster.run(0, ["scancel", job_id])  # SIGTERM to every process of the job, SIGKILL after KillWait
    info = cluster.wait_job(job_id, ("CANCELLED",), timeout=120)
    out = (folder / "job.out").read_text()
    stopped = result_lines(out)
    assert len(stopped) == 1 and stopped[0]["preempted"] is True, out[-4000:]
    step = stopped[0]["steps"]
    assert 0 < step < EPOCHS * STEPS_PER_EPOCH
    newest_dir = folder / "c" / newest(folder / "c")
    assert verify(str(newest_dir))["step"] == step  # intact (every file's SHA-256) and of the step it stopped at
    # SLURM kills what is left of a step once its first process ends: hvdkit run must be that
    # process (exec), so the batch step lasts until the checkpoint is on disk.
    saved = (newest_dir / "manifest.json").stat().st_mtime
    assert step_ended(cluster, cluster.nodes[0], f"{job_id}.batch") >= saved - 0.001, info


def test_a_requeued_job_resumes_from_its_checkpoint_and_ends_where_an_uninterrupted_run_ends(cluster, one_host):
    folder = cluster.folder("requeue")
    render_job(folder, folder / "c")
    _, job_id = sbatch(cluster, folder, "--requeue", "--open-mode=append")
    wait_for_checkpoint(cluster, folder / "c", job_id)
    cluster.run(0, ["scontrol", "requeue", job_id])  # as a preemption with PreemptMode=REQUEUE does
    # SLURM holds a requeued batch job for about two minutes (Reason=BeginTime): start it as soon as it is pending
    cluster.wait_job(job_id, ("PENDING",), timeout=120)
    cluster.run(0, ["scontrol", "update", f"JobId={job_id}", "StartTime=now"])
    info = cluster.wait_job(job_id, ("COMPLETED", "FAILED", "CANCELLED"), timeout=400)
    out = (folder / "job.out").read_text()
    assert info["JobState"] == "COMPLETED" and info["Restarts"] == "1", out[-4000:]
    stopped, final = result_lines(out)
    assert stopped["preempted"] is True and final["preempted"] is False
    assert final["resumed_from_epoch"] == stopped["steps"] // STEPS_PER_EPOCH  # from the stop step's epoch
    reference, reference_params = one_host
    assert final["steps"] == reference["steps"] == EPOCHS * STEPS_PER_EPOCH
    assert (final["val_accuracy"], final["val_loss"]) == (reference["val_accuracy"], reference["val_loss"])
    assert_same_params(params(folder / "c"), reference_params)

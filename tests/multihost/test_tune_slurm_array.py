"""`hvdkit render slurm --tune 2` submitted unchanged to a real SLURM (Debian's slurm-wlm and munge, the
controller and two slurmd nodes that tests/multihost/slurm.py starts): the job array's two tasks each
run one `hvdkit tune` worker, on the two nodes (submitted --exclusive), against one journal file in
the folder both nodes share; together they finish exactly --trials trials, none twice. Needs root;
opt-in like test_slurm.py (make slurm-test, or HVDKIT_TEST_SLURM=1)."""

import os
import subprocess

import pytest
from helpers import BIN, HVDKIT, PYTHON
from shared_study import SPACE, STUDY, check_one_study, worker_argv
from slurm import NEEDS_SLURM, SlurmCluster

pytestmark = NEEDS_SLURM
optuna = pytest.importorskip("optuna")


@pytest.fixture(scope="module")
def cluster():
    c = SlurmCluster()
    try:
        yield c.open()
    finally:
        c.close()
    assert c.leftovers() == []


def test_a_rendered_tune_array_runs_two_workers_on_two_nodes_against_one_journal_study(cluster):
    folder = cluster.folder("tune")
    (folder / "space.yaml").write_text(SPACE)
    journal, out = folder / "study.journal", folder / "out"
    tune = worker_argv(folder / "space.yaml", out, str(journal), seed=0, hvdkit="hvdkit")
    rendered = subprocess.run(
        [HVDKIT, "render", "slurm", "--tune", "2", "--name", STUDY, "--memory", "512Mi", "--", *tune],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    (folder / "tune.sbatch").write_text(rendered)
    env = {"PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}", "HVDKIT_NUM_THREADS": "1"}
    argv = ["sh", "-c", 'cd "$0" && exec sbatch --parsable --wait --exclusive "$@" tune.sbatch', str(folder)]
    p = cluster.run(0, [*argv, f"--output={folder / 'task-%a.out'}"], check=False, timeout=600, env=env)
    outputs = [(folder / f"task-{i}.out").read_text() if (folder / f"task-{i}.out").exists() else "" for i in (0, 1)]
    assert p.returncode == 0, p.stdout + p.stderr + "\n".join(o[-3000:] for o in outputs) + cluster.logs()
    job_id = p.stdout.strip().splitlines()[0].split(";")[0]
    nodes = {cluster.job(f"{job_id}_{i}").get("NodeList") for i in (0, 1)}
    assert nodes == set(cluster.nodes), nodes  # one worker on each node
    study = optuna.load_study(storage=optuna.storages.JournalStorage(_backend(journal)), study_name=STUDY)
    check_one_study([(0, o) for o in outputs], [out / "task-0", out / "task-1"], study)
    assert rendered.count("\n#SBATCH") == 6 and PYTHON in rendered


def _backend(path):
    from optuna.storages.journal import JournalFileBackend

    return JournalFileBackend(str(path))

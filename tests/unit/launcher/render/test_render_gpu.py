"""hvdkit render --gpus-per-node: one rank per GPU in the SLURM script and the MPIJob, and clear
errors for counts that are not whole numbers of GPUs."""

import pytest
import yaml

from hvdkit import cli
from hvdkit.core import ConfigError
from hvdkit.launcher.render import files as render
from hvdkit.launcher.render.files import RenderSpec

COMMAND = ("python", "train.py")


def _sbatch(text):
    return [line for line in text.splitlines() if line.startswith("#SBATCH ")]


def test_slurm_gpu_job_asks_for_the_gpus_and_one_task_per_gpu():
    text = render.render("slurm", RenderSpec(COMMAND, nodes=2, gpus_per_node=4))
    lines = _sbatch(text)
    assert "#SBATCH --gres=gpu:4" in lines
    assert "#SBATCH --ntasks-per-node=4" in lines and "#SBATCH --ntasks=8" in lines and "#SBATCH --nodes=2" in lines
    assert not any("gpus-per-task" in line or "gpu-bind" in line for line in lines)
    assert "Not --gpus-per-task=1" in text  # the comment says why not
    assert 'exec hvdkit run -np "$SLURM_NTASKS" -- python train.py' in text


def test_slurm_gpu_lines_stay_in_the_sbatch_block():
    lines = render.render("slurm", RenderSpec(COMMAND, gpus_per_node=2)).splitlines()
    first_command = next(i for i, line in enumerate(lines) if line.strip() and not line.startswith("#"))
    assert lines.index("#SBATCH --gres=gpu:2") < first_command


def test_a_cpu_job_asks_for_no_gpu():
    text = render.render("slurm", RenderSpec(COMMAND, nodes=2, slots_per_node=4))
    assert "gres" not in text and "GPU" not in text
    worker = _worker(render.render("mpijob", RenderSpec(COMMAND, nodes=2, slots_per_node=4)))
    assert "nvidia.com/gpu" not in worker["resources"]["limits"]


def _worker(text):
    doc = yaml.safe_load(text)
    return doc["spec"]["mpiReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]


def test_mpijob_workers_get_the_gpus_and_one_slot_per_gpu():
    text = render.render("mpijob", RenderSpec(COMMAND, nodes=3, gpus_per_node=8, image="reg/hvdkit:gpu"))
    doc = yaml.safe_load(text)
    assert doc["spec"]["slotsPerWorker"] == 8
    assert doc["spec"]["mpiReplicaSpecs"]["Worker"]["replicas"] == 3
    assert _worker(text)["resources"]["limits"] == {"cpu": "8", "memory": "2Gi", "nvidia.com/gpu": 8}
    launcher = doc["spec"]["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]["containers"][0]
    assert "resources" not in launcher and launcher["args"][:4] == ["hvdkit", "run", "-np", "24"]


def test_the_header_renders_the_gpu_job_again(capsys):
    spec = RenderSpec(COMMAND, nodes=2, gpus_per_node=2)
    again = render.render_command("slurm", spec)
    assert again[again.index("--gpus-per-node") + 1] == "2" and "--slots-per-node" not in again
    assert cli.main(again[1:]) == 0
    assert capsys.readouterr().out == render.render("slurm", spec)


@pytest.mark.parametrize("value", [0, -1, "0", "-2", "two", "2.5", "", 1.0, True])
def test_a_gpu_count_that_is_not_a_whole_number_above_zero_names_the_value_and_the_fix(value):
    with pytest.raises(ConfigError) as e:
        RenderSpec(COMMAND, gpus_per_node=value)
    assert f"--gpus-per-node must be a whole number of GPUs >= 1 (got {value!r})" in str(e.value)
    assert "e.g. --gpus-per-node 4" in str(e.value)


def test_the_cli_reports_a_bad_gpu_count_with_exit_2(capsys):
    assert cli.main(["render", "slurm", "--gpus-per-node", "two", "--", *COMMAND]) == 2
    assert "--gpus-per-node must be a whole number of GPUs >= 1 (got 'two')" in capsys.readouterr().err


def test_slots_per_node_other_than_the_gpus_is_refused_with_the_fix():
    with pytest.raises(ConfigError, match=r"--slots-per-node 3 differs from --gpus-per-node 2.*--slots-per-node 2"):
        RenderSpec(COMMAND, slots_per_node=3, gpus_per_node=2)
    assert RenderSpec(COMMAND, slots_per_node=2, gpus_per_node="2").gpus_per_node == 2


def test_the_gpu_examples_in_launch_are_gpu_jobs():
    files = render.example_files()
    assert "#SBATCH --gres=gpu:4" in files["slurm-gpu.sbatch"]
    assert _worker(files["mpijob-gpu.yaml"])["resources"]["limits"]["nvidia.com/gpu"] == 4

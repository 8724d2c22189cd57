"""`hvdkit render`: SLURM script, MPIJob, plain launcher scripts and hostfile from one job description."""

import os
import shlex
import subprocess
import sys

import pytest
import yaml
from helpers import ROOT
from rendered_scripts import argv_the_script_runs

from hvdkit import cli
from hvdkit.core import ConfigError
from hvdkit.launcher.hosts import Host, parse_hostfile
from hvdkit.launcher.plan import build
from hvdkit.launcher.render import files as render
from hvdkit.launcher.render.files import EXAMPLE, RenderSpec
from hvdkit.launcher.spec import JobSpec

COMMAND = ("python", "examples/torch_digits.py")


def _last_line(text):
    return text.rstrip("\n").splitlines()[-1]


def test_mpijob_parses_as_an_mpi_operator_v2beta1_job():
    job = yaml.safe_load(render.render("mpijob", EXAMPLE))
    assert (job["apiVersion"], job["kind"]) == ("kubeflow.org/v2beta1", "MPIJob")
    assert job["metadata"] == {"name": "hvdkit-digits"}
    spec = job["spec"]
    assert spec["slotsPerWorker"] == 2
    assert spec["runPolicy"] == {"cleanPodPolicy": "Running"}
    assert spec["sshAuthMountPath"] == "/home/hvdkit/.mpi-operator/ssh"  # the entrypoint copies the keys from there
    launcher = spec["mpiReplicaSpecs"]["Launcher"]
    assert launcher["replicas"] == 1
    (container,) = launcher["template"]["spec"]["containers"]
    assert container["image"] == "hvdkit:cpu"
    assert "command" not in container  # it would replace the image's entrypoint
    assert container["args"] == ["hvdkit", "run", "-np", "4", "--", *COMMAND]
    worker = spec["mpiReplicaSpecs"]["Worker"]
    assert worker["replicas"] == 2
    (container,) = worker["template"]["spec"]["containers"]
    assert container["image"] == "hvdkit:cpu"
    assert container["resources"] == {"limits": {"cpu": "2", "memory": "4Gi"}}


def test_mpijob_keeps_a_command_with_yaml_special_characters_as_one_argv():
    command = ("python", "-c", "print('a: b # c')", "--flag=- x", "yes", "0755")
    job = yaml.safe_load(render.render("mpijob", RenderSpec(command=command)))
    (launcher,) = job["spec"]["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]["containers"]
    assert launcher["args"] == ["hvdkit", "run", "-np", "1", "--", *command]


def test_slurm_script_has_the_sbatch_lines_and_runs_hvdkit_inside_the_allocation():
    text = render.render("slurm", EXAMPLE)
    assert text.startswith("#!/bin/bash\n")
    assert [line for line in text.splitlines() if line.startswith("#SBATCH")] == [
        "#SBATCH --job-name=hvdkit-digits",
        "#SBATCH --nodes=2",
        "#SBATCH --ntasks=4",
        "#SBATCH --ntasks-per-node=2",
        "#SBATCH --cpus-per-task=1",
        "#SBATCH --mem=4G",
    ]
    assert "set -euo pipefail\n" in text
    assert "#   srun --mpi=pmix python examples/torch_digits.py\n" in text
    # exec: the script's own process is hvdkit run, which SLURM's SIGTERM reaches (a checkpoint, then exit)
    assert _last_line(text) == 'exec hvdkit run -np "$SLURM_NTASKS" -- python examples/torch_digits.py'


def test_sbatch_directives_come_before_the_first_command():
    # sbatch stops reading #SBATCH lines at the first line that is not a comment
    lines = render.render("slurm", EXAMPLE).splitlines()
    first_command = next(i for i, line in enumerate(lines) if line and not line.startswith("#"))
    assert max(i for i, line in enumerate(lines) if line.startswith("#SBATCH")) < first_command


@pytest.mark.parametrize("target", ["slurm", "mpirun", "horovodrun"])
def test_rendered_scripts_pass_bash_syntax_check_and_quote_every_argument(target, tmp_path):
    command = ("python", "my script.py", "--note", "it's; rm -rf / $HOME `x`")
    text = render.render(target, RenderSpec(command=command, nodes=2, slots_per_node=2))
    path = tmp_path / "job.sh"
    path.write_text(text)
    check = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True)
    assert check.returncode == 0, check.stderr
    assert tuple(shlex.split(_last_line(text))[-4:]) == command


def test_mpirun_script_line_is_the_dry_run_plan_for_the_same_hosts():
    text = render.render("mpirun", EXAMPLE)
    argv = shlex.split(_last_line(text))
    hosts = (Host("node1", 2), Host("node2", 2))
    # the script runs the bare `mpirun` its users' PATH finds: no prefix implied, none to drop
    plan = build(JobSpec(COMMAND, 4, hosts=hosts), is_root=False, cores=2, base_env={"PATH": "/bin"}, mpirun="mpirun")
    assert argv == ["exec", "mpirun", *plan.argv[1:]]
    assert argv[2:6] == ["-np", "4", "-H", "node1:2,node2:2"]
    assert "export PYTHONUNBUFFERED=1\n" in text  # mpirun -x PYTHONUNBUFFERED passes on this value


def test_horovodrun_script_line_is_the_gloo_plan_for_the_given_hosts():
    spec = RenderSpec(command=COMMAND, hosts=(Host("gpu1", 4), Host("gpu2", 2)))
    argv = shlex.split(_last_line(render.render("horovodrun", spec)))
    assert argv == ["exec", "horovodrun", "-np", "6", "-H", "gpu1:4,gpu2:2", "--gloo", *COMMAND]


def test_the_hostfile_reads_back_as_the_hosts_of_the_scripts():
    assert parse_hostfile(render.render("hostfile", EXAMPLE)) == (Host("node1", 2), Host("node2", 2))


def test_unset_counts_follow_from_the_others():
    spec = RenderSpec(command=COMMAND, nodes=3, slots_per_node=4)
    assert (spec.num_proc, spec.cpu, spec.memory) == (12, 4, "2Gi")
    from_hosts = RenderSpec(command=COMMAND, hosts=(Host("a", 2), Host("b", 1)))
    assert (from_hosts.nodes, from_hosts.slots_per_node, from_hosts.num_proc) == (2, 2, 3)


@pytest.mark.parametrize(
    "fields, message",
    [
        ({"num_proc": 5, "nodes": 2, "slots_per_node": 2}, r"-np 5 does not fit 2 node\(s\) x 2 slot\(s\) = 4"),
        ({"num_proc": 0}, r"-np/--num-proc must be an integer >= 1 \(got 0\)"),
        ({"nodes": 0}, r"--nodes must be an integer >= 1 \(got 0\)"),
        ({"slots_per_node": 4, "cpu": 2}, r"--cpu 2 per worker is fewer than its 4 slots"),
        ({"memory": "4GB"}, r"--memory '4GB' must be a whole number of Mi, Gi or Ti, e.g. 4Gi"),
        ({"name": "My_Job"}, r"--name 'My_Job' must be lowercase letters, digits and '-'"),
        ({"image": "a b"}, r"--image 'a b' must be an image reference"),
        ({"command": ()}, r"put it after '--'"),
        ({"hosts": (Host("a", 1),), "num_proc": 2}, r"-np 2 does not fit 1 node\(s\) x 1 slot\(s\)"),
    ],
)
def test_a_bad_job_description_names_the_flag_and_the_value(fields, message):
    with pytest.raises(ConfigError, match=message):
        RenderSpec(**{"command": COMMAND, **fields})


def test_an_unknown_target_lists_the_known_ones():
    with pytest.raises(ConfigError, match="unknown render target 'pbs'; choose one of slurm, mpijob, mpirun"):
        render.render("pbs", EXAMPLE)


@pytest.mark.parametrize("target", render.TARGETS)
def test_the_header_holds_the_hvdkit_render_line_that_writes_the_file_again(target, tmp_path):
    text = render.render(target, EXAMPLE)
    argv = render.render_command(target, EXAMPLE)
    assert f"#   {shlex.join(argv)}\n" in text
    out = tmp_path / "out"
    assert cli.main([*argv[1:3], "-o", str(out), *argv[3:]]) == 0
    assert out.read_text() == text
    assert os.access(out, os.X_OK) == text.startswith("#!")


def test_hvdkit_render_hosts_come_from_a_hostfile(tmp_path, capsys):
    hostfile = tmp_path / "hosts"
    hostfile.write_text("# two boxes\nbox1 slots=3\nbox2:1\n")
    assert cli.main(["render", "mpirun", "--hostfile", str(hostfile), "--", *COMMAND]) == 0
    argv = shlex.split(_last_line(capsys.readouterr().out))
    assert argv[1:6] == ["mpirun", "-np", "4", "-H", "box1:3,box2:1"]


def test_the_launch_folder_holds_exactly_what_the_renderer_writes():
    files = render.example_files()
    assert sorted(files) == [
        "horovodrun.sh",
        "hostfile.example",
        "mpijob-elastic.yaml",
        "mpijob-gpu.yaml",
        "mpijob.yaml",
        "mpirun.sh",
        "slurm-gpu.sbatch",
        "slurm.sbatch",
    ]
    for name, text in files.items():
        committed = (ROOT / "launch" / name).read_text()
        assert committed == text, f"launch/{name} is out of date: run `make render`"


def test_the_example_files_hold_nothing_of_the_machine_that_rendered_them():
    for name, text in render.example_files().items():
        for local in (str(ROOT), sys.executable):
            assert local not in text, (name, local)
        assert "/usr/bin/mpirun" not in text and "rankwrap" not in text, name


# Values that end a line, or that bash, YAML or sbatch read specially, must reach each rendered file
# as the same words: no comment may end early, no key may be injected.
CODE_WITH_NEWLINES = ("python", "-c", "import sys\nprint(sys.argv)\n#SBATCH --nodes=99", "a\u2028b\x85c\r\td")


def _non_comment_lines(text):
    return [line for line in text.splitlines() if line.strip() and not line.startswith("#")]


def test_a_newline_in_the_command_leaves_every_sbatch_line_and_comment_intact(tmp_path):
    text = render.render("slurm", RenderSpec(command=CODE_WITH_NEWLINES, nodes=2, slots_per_node=2))
    # sbatch reads #SBATCH lines only up to the first command: two commands in all, after them.
    assert _non_comment_lines(text) == ["set -euo pipefail", text.splitlines()[-1]]
    assert [line for line in text.splitlines() if line.startswith("#SBATCH")][:2] == [
        "#SBATCH --job-name=hvdkit-job",
        "#SBATCH --nodes=2",
    ]
    assert len(text.split("\n")) == len(text.splitlines()) + 1  # no line separator but "\n" anywhere
    code, argv, err = argv_the_script_runs(text, "hvdkit", tmp_path, env={"SLURM_NTASKS": "4"})
    assert (code, argv) == (0, ["run", "-np", "4", "--", *CODE_WITH_NEWLINES]), err


@pytest.mark.parametrize("target, tool", [("mpirun", "mpirun"), ("horovodrun", "horovodrun")])
def test_a_newline_in_the_command_reaches_the_launcher_as_the_same_words(target, tool, tmp_path):
    spec = RenderSpec(command=CODE_WITH_NEWLINES, nodes=2, slots_per_node=2)
    text = render.render(target, spec)
    assert _non_comment_lines(text) == ["set -euo pipefail", "export PYTHONUNBUFFERED=1", text.splitlines()[-1]]
    code, argv, err = argv_the_script_runs(text, tool, tmp_path)
    assert code == 0, err
    assert argv[-len(CODE_WITH_NEWLINES) :] == list(CODE_WITH_NEWLINES)


def test_a_newline_in_the_command_injects_no_key_into_the_mpijob():
    command = ("python", "-c", "x = 1\nkind: Pod\nmetadata: {name: evil}\n- a\n")
    text = render.render("mpijob", RenderSpec(command=command))
    job = yaml.safe_load(text)
    assert sorted(job) == ["apiVersion", "kind", "metadata", "spec"]
    assert (job["kind"], job["metadata"]) == ("MPIJob", {"name": "hvdkit-job"})
    (launcher,) = job["spec"]["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]["containers"]
    assert launcher["args"] == ["hvdkit", "run", "-np", "1", "--", *command]


def test_a_newline_in_the_command_stays_in_the_hostfile_comments():
    text = render.render("hostfile", RenderSpec(command=CODE_WITH_NEWLINES, nodes=2, slots_per_node=2))
    assert _non_comment_lines(text) == ["node1 slots=2", "node2 slots=2"]
    assert parse_hostfile(text) == (Host("node1", 2), Host("node2", 2))


@pytest.mark.parametrize(
    "fields, message",
    [
        ({"name": "job\n"}, r"--name 'job\\n' must be lowercase letters"),
        ({"memory": "4Gi\n"}, r"--memory '4Gi\\n' must be a whole number"),
        ({"image": "hvdkit:cpu\x1b[2J"}, r"--image 'hvdkit:cpu\\x1b\[2J' must be an image reference"),
        ({"command": ("python", "a\0b")}, r"command word 'a\\x00b' holds a NUL character"),
        ({"command": ("python", "caf\udce9.py")}, r"command word 'caf\\udce9.py' holds bytes that are not UTF-8"),
    ],
)
def test_a_value_that_cannot_be_written_on_one_line_is_rejected_with_its_fix(fields, message):
    with pytest.raises(ConfigError, match=message):
        RenderSpec(**{"command": COMMAND, **fields})

"""`hvdkit render --min-np/--max-np`: the MPIJob polls the MPI Operator's discovery script, the SLURM
script keeps its allocation when a node fails and says what elastic means inside it."""

import dataclasses
import subprocess

import pytest
import yaml

from hvdkit.cli import main
from hvdkit.core import ConfigError
from hvdkit.launcher.render import files as render
from hvdkit.launcher.render.files import EXAMPLE, MPI_OPERATOR_DISCOVERY, RenderSpec

ELASTIC = dataclasses.replace(EXAMPLE, min_np=2, max_np=6)
COMMAND = list(EXAMPLE.command)


def test_an_elastic_mpijob_launcher_polls_the_operators_discovery_script_with_the_bounds():
    job = yaml.safe_load(render.render("mpijob", ELASTIC))
    (launcher,) = job["spec"]["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]["containers"]
    assert launcher["args"] == [
        "hvdkit",
        "run",
        "-np",
        "4",
        "--min-np",
        "2",
        "--max-np",
        "6",
        "--host-discovery-script",
        MPI_OPERATOR_DISCOVERY,
        "--slots-per-host",
        "2",
        "--",
        *COMMAND,
    ]
    assert MPI_OPERATOR_DISCOVERY == "/etc/mpi/discover_hosts.sh"
    text = render.render("mpijob", ELASTIC)
    assert "# Elastic: the operator keeps /etc/mpi/discover_hosts.sh listing the running workers" in text
    assert "--min-np 2 --max-np 6 -- python examples/torch_digits.py" in text.splitlines()[3]  # render it again


def test_a_plain_mpijob_names_no_discovery_script():
    assert MPI_OPERATOR_DISCOVERY not in render.render("mpijob", EXAMPLE)


def test_an_elastic_slurm_script_keeps_its_allocation_and_explains_elastic_inside_it():
    text = render.render("slurm", dataclasses.replace(ELASTIC, max_np=4))
    lines = text.splitlines()
    assert "#SBATCH --no-kill" in lines
    first_command = next(i for i, line in enumerate(lines) if line and not line.startswith("#"))
    assert max(i for i, line in enumerate(lines) if line.startswith("#SBATCH")) < first_command
    assert "# Elastic (--min-np/--max-np) inside a fixed allocation: the hosts are this allocation's nodes and" in lines
    assert lines[-1].endswith('hvdkit run -np "$SLURM_NTASKS" --min-np 2 --max-np 4 -- python examples/torch_digits.py')
    assert subprocess.run(["bash", "-n"], input=text, text=True).returncode == 0


def test_an_elastic_slurm_script_that_could_never_reach_its_max_np_is_refused_naming_both_fixes(capsys):
    """The allocation holds -np tasks and an elastic job never grows past it: the script always failed."""
    with pytest.raises(
        ConfigError,
        match=r"grows only within its allocation of -np 4 tasks, so --max-np 6 can never be "
        r"reached .*; render with -np 6 to allocate 6 tasks, or --max-np 4$",
    ):
        render.render("slurm", ELASTIC)
    assert main(["render", "slurm", "--nodes", "2", "-np", "2", "--max-np", "3", "--", "python", "t.py"]) == 2
    assert "--max-np 3 can never be reached" in capsys.readouterr().err
    assert "--min-np 2 --max-np 6" in render.render("mpijob", ELASTIC)  # the MPI Operator adds workers: it may grow


def test_an_elastic_bound_alone_defaults_the_other_to_np():
    spec = RenderSpec(command=("python", "t.py"), nodes=2, min_np=1)
    assert spec.elastic_flags == ["--min-np", "1", "--max-np", "2"]
    assert RenderSpec(command=("python", "t.py")).elastic_flags == []


@pytest.mark.parametrize(
    "lo, hi, message", [(3, None, r"got 3 <= 2 <= 2"), (None, 1, r"got 2 <= 2 <= 1"), (0, 2, "--min-np must be")]
)
def test_elastic_bounds_out_of_order_are_an_error(lo, hi, message):
    with pytest.raises(ConfigError, match=message):
        RenderSpec(command=("python", "t.py"), nodes=2, min_np=lo, max_np=hi)


def test_render_refuses_elastic_bounds_for_plain_scripts(capsys):
    assert main(["render", "mpirun", "--nodes", "2", "--min-np", "1", "--", "python", "-c", "pass"]) == 2
    assert "--min-np/--max-np render only slurm and mpijob files (got mpirun)" in capsys.readouterr().err
    assert main(["render", "slurm", "--nodes", "2", "--min-np", "1", "--", "python", "t.py"]) == 0
    assert "--min-np 1 --max-np 2 -- python t.py" in capsys.readouterr().out

import pytest

from hvdkit.core import errors
from hvdkit.core.topology import Topology, from_env


def test_open_mpi_variables_give_the_topology():
    env = {
        "OMPI_COMM_WORLD_RANK": "3",
        "OMPI_COMM_WORLD_SIZE": "4",
        "OMPI_COMM_WORLD_LOCAL_RANK": "1",
        "OMPI_COMM_WORLD_LOCAL_SIZE": "2",
    }
    assert from_env(env) == Topology(3, 4, 1, 2)


def test_horovodrun_variables_win_over_open_mpi_ones():
    env = {"HOROVOD_RANK": "1", "HOROVOD_SIZE": "2", "OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "2"}
    assert from_env(env).rank == 1


def test_slurm_per_node_counts_are_parsed():
    env = {"SLURM_PROCID": "5", "SLURM_NTASKS": "8", "SLURM_LOCALID": "1", "SLURM_NTASKS_PER_NODE": "4(x2)"}
    assert from_env(env) == Topology(5, 8, 1, 4)


def test_no_launcher_means_one_process():
    assert from_env({}) == Topology(0, 1, 0, 1)


def test_bad_rank_variable_names_the_variable():
    with pytest.raises(errors.ConfigError, match="OMPI_COMM_WORLD_RANK"):
        from_env({"OMPI_COMM_WORLD_RANK": "x", "OMPI_COMM_WORLD_SIZE": "2"})


def test_rank_outside_size_is_rejected():
    with pytest.raises(errors.ConfigError, match="rank=2, size=2"):
        Topology(2, 2)


@pytest.mark.parametrize(
    "cls, builtin",
    [
        (errors.ConfigError, ValueError),
        (errors.CheckpointError, RuntimeError),
        (errors.LaunchError, RuntimeError),
        (errors.CollectiveError, RuntimeError),
        (errors.MissingDependencyError, ImportError),
    ],
)
def test_every_error_is_also_the_matching_builtin(cls, builtin):
    assert issubclass(cls, errors.HvdkitError) and issubclass(cls, builtin)

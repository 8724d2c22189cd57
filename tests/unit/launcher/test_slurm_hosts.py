"""Inside a SLURM job, mpirun reaches the other nodes through srun: hvdkit run needs no ssh there."""

import pytest

from hvdkit.launcher import hosts


@pytest.mark.parametrize(
    "environ, expected",
    [
        ({"SLURM_JOBID": "17", "SLURM_JOB_NODELIST": "n[1-2]"}, True),  # sbatch, salloc and srun set it
        ({}, False),  # outside SLURM: ranks on other hosts start over ssh
        ({"SLURM_JOBID": ""}, False),
        ({"SLURM_JOB_ID": "17"}, False),  # Open MPI's plm/slurm looks for SLURM_JOBID, not this one
    ],
)
def test_mpirun_uses_srun_exactly_when_open_mpi_sees_a_slurm_job(environ, expected):
    assert hosts.mpirun_uses_srun(environ) is expected

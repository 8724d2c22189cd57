"""``hvdkit run --recovery in-process``: the ranks' Gloo timeout is 120 s unless the user set
HOROVOD_GLOO_TIMEOUT_SECONDS, in the environment or with ``-x`` (before, a ``-x`` value was overridden by 120)."""

import pytest

from hvdkit.cli import _parser
from hvdkit.cli.run import IN_PROCESS_GLOO_TIMEOUT, job_of

IN_PROCESS = ["run", "-np", "2", "--min-np", "1", "--max-np", "2", "--recovery", "in-process"]


def env_of(*flags):
    spec, _ = job_of(_parser().parse_args([*IN_PROCESS, *flags, "--", "python", "train.py"]))
    return spec.env


def test_in_process_ranks_get_a_gloo_timeout_of_120_s_by_default(monkeypatch):
    monkeypatch.delenv("HOROVOD_GLOO_TIMEOUT_SECONDS", raising=False)
    env = env_of()
    assert env["HOROVOD_GLOO_TIMEOUT_SECONDS"] == str(IN_PROCESS_GLOO_TIMEOUT) == "120"
    assert env["HVDKIT_RECOVERY"] == "in-process"


@pytest.mark.parametrize(
    "flags", [("-x", "HOROVOD_GLOO_TIMEOUT_SECONDS=300"), ("--env", "HOROVOD_GLOO_TIMEOUT_SECONDS=300")]
)
def test_a_gloo_timeout_given_with_x_is_the_one_the_ranks_get(monkeypatch, flags):
    monkeypatch.delenv("HOROVOD_GLOO_TIMEOUT_SECONDS", raising=False)
    assert env_of(*flags)["HOROVOD_GLOO_TIMEOUT_SECONDS"] == "300"


def test_a_gloo_timeout_in_the_environment_is_left_to_it(monkeypatch):
    monkeypatch.setenv("HOROVOD_GLOO_TIMEOUT_SECONDS", "45")
    assert "HOROVOD_GLOO_TIMEOUT_SECONDS" not in env_of()  # the ranks inherit the environment's 45

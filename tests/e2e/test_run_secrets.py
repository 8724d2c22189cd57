"""No value of the launching shell's environment is readable by another user while a job runs (issue 35,
item 2). Horovod's Gloo launcher used to start each rank as ``sh -c "env NAME=VALUE ... python ..."``,
a command line every local user can read for the whole job (engine fix 08 ends that); mpirun passes
names only (``-x NAME``). A token of the launching shell is looked for in everything the user
``nobody`` can read in ``/proc/*/cmdline`` and ``/proc/*/environ`` while both ranks run.
"""

import os
import secrets
import subprocess
import time

import pytest
from helpers import HVDKIT, PYTHON, ROOT, end_job
from other_user import NEEDS_ROOT, read_as_nobody, where

pytestmark = [pytest.mark.dist, NEEDS_ROOT]
SCRIPT = ROOT / "tests" / "e2e" / "scripts" / "wait_for_go.py"


@pytest.mark.parametrize("controller", [["--gloo"], []], ids=["gloo", "mpi"])
def test_a_token_of_the_launching_shell_is_in_no_command_line_another_user_can_read(tmp_path, controller):
    token = "tok-" + secrets.token_hex(16)
    env = dict(os.environ, MY_API_TOKEN=token)
    argv = [HVDKIT, "run", "-np", "2", *controller, "--", PYTHON, str(SCRIPT), str(tmp_path)]
    proc = subprocess.Popen(
        argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )
    try:
        deadline = time.monotonic() + 120
        while not all((tmp_path / f"ready.{r}").exists() for r in (0, 1)):
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate(timeout=30)[0][-3000:]
            time.sleep(0.1)
        seen = read_as_nobody()
        assert str(SCRIPT) in seen  # the ranks' command lines were readable...
        assert token not in seen, where(
            seen, token
        )  # ...and the token is in none of them (before fix 08, --gloo: in both ranks')
        (tmp_path / "go").touch()
        output = proc.communicate(timeout=60)[0]
        assert proc.returncode == 0, output[-3000:]
        assert output.count("ENDED") == 2
    finally:
        (tmp_path / "go").touch()
        end_job([], proc)

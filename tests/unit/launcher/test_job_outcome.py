"""How `hvdkit run` reads a job's end when the stop was sent to the whole job (SLURM's scancel
signals mpirun as well as hvdkit run): ranks that all ended cleanly make a clean stop."""

import signal

from hvdkit.launcher import execute


def ended(rank, code=0, sig=None):
    return {"rank": rank, "exit_code": code, "signal": sig, "ended": 1.0 + rank, "host": "h", "seconds": 1.0}


STARTED = {0: {"pid": 10, "host": "h"}, 1: {"pid": 11, "host": "h"}}


def test_a_stopped_job_whose_ranks_all_ended_cleanly_is_a_clean_stop_whatever_mpirun_returned():
    result = execute._outcome(1, {0: ended(0), 1: ended(1)}, 2.0, interrupted_by=signal.SIGTERM, started=STARTED)
    assert (result.exit_code, result.interrupted_by, result.failed_rank) == (0, signal.SIGTERM, None)


def test_a_stopped_job_with_a_rank_that_never_reported_its_end_is_not_called_clean():
    result = execute._outcome(1, {0: ended(0)}, 2.0, interrupted_by=signal.SIGTERM, started=STARTED)
    assert result.exit_code == 1 and "before any rank reported a failure" in result.message


def test_without_a_stop_the_launchers_failure_still_counts_when_the_ranks_ended_cleanly():
    result = execute._outcome(1, {0: ended(0), 1: ended(1)}, 2.0, started=STARTED)
    assert result.exit_code == 1


def test_a_rank_that_failed_during_a_stop_is_still_named():
    result = execute._outcome(
        1, {0: ended(0), 1: ended(1, code=4)}, 2.0, interrupted_by=signal.SIGTERM, started=STARTED
    )
    assert (result.exit_code, result.failed_rank) == (4, 1)

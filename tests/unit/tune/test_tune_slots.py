"""hvdkit tune's slot planner: P trials of K ranks get P disjoint groups of K cores, or a clear error
(never oversubscribed), and pinning a program to a group makes hvdkit run count exactly those cores."""

import subprocess
import sys

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hvdkit.core.errors import ConfigError
from hvdkit.tune.runner import TrialLaunch, hvdkit_run_argv
from hvdkit.tune.slots import SlotPool, local_cores, plan_slots


def test_two_trials_of_one_rank_on_two_cores_get_one_core_each():
    assert plan_slots(2, 1, [0, 1]) == [(0,), (1,)]
    assert plan_slots(2, 2, [3, 5, 8, 9]) == [(3, 5), (8, 9)]


def test_more_ranks_than_cores_is_an_error_naming_what_fits():
    with pytest.raises(ConfigError) as e:
        plan_slots(2, 2, [0, 1])
    assert "--parallel 2 trials x -np 2 ranks need 4 cores" in str(e.value)
    assert "gives 2 (cores 0,1)" in str(e.value) and "use --parallel 1 with -np 2" in str(e.value)
    with pytest.raises(ConfigError, match="use -np 2 or fewer"):
        plan_slots(1, 3, [0, 1])
    with pytest.raises(ConfigError, match="--parallel must be an integer >= 1"):
        plan_slots(0, 1, [0, 1])


@given(st.integers(1, 8), st.integers(1, 8), st.lists(st.integers(0, 63), unique=True, max_size=32))
def test_groups_are_disjoint_sized_k_and_within_the_cores_or_the_plan_is_refused(parallel, k, cores):
    if parallel * k > len(cores):
        with pytest.raises(ConfigError):
            plan_slots(parallel, k, cores)
        return
    groups = plan_slots(parallel, k, cores)
    flat = [c for g in groups for c in g]
    assert len(groups) == parallel and all(len(g) == k for g in groups)
    assert len(set(flat)) == len(flat) and set(flat) <= set(cores)


def test_the_pool_lends_each_group_once_and_takes_back_only_its_own():
    pool = SlotPool([(0,), (1,)])
    a, b = pool.take(), pool.take()
    assert {a, b} == {(0,), (1,)} and pool.free() == 0
    with pytest.raises(RuntimeError):
        pool.take()
    pool.give(b)
    with pytest.raises(RuntimeError):
        pool.give(b)
    with pytest.raises(RuntimeError):
        pool.give((7,))
    assert pool.take() == b


def test_a_pinned_program_sees_only_its_group_as_this_machine_s_cores():
    core = local_cores()[-1]
    launch = TrialLaunch(0, ("python", "t.py"), 1, (core,), "log", "rep")
    argv = hvdkit_run_argv(launch, python=sys.executable)
    assert argv[:5] == [sys.executable, "-m", "hvdkit.tune.pin", str(core), "--"]
    assert argv[5:] == [sys.executable, "-m", "hvdkit", "run", "-np", "1", "--", "python", "t.py"]
    out = subprocess.run(
        [*argv[:5], sys.executable, "-c", "import os; print(sorted(os.sched_getaffinity(0)))"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    assert out.strip() == f"[{core}]"


def test_a_command_without_trial_dir_gets_a_note_about_shared_checkpoints():
    from hvdkit.tune.config import placeholder_note, substitute

    assert "give each trial its own folder" in placeholder_note(("python", "train.py", "--epochs", "3"))
    assert placeholder_note(("python", "train.py", "--checkpoint-dir", "{trial_dir}/ckpt")) is None
    assert substitute(("a{trial_dir}/c", "{trial}", "{other}"), "/o/trials/0003", 3) == [
        "a/o/trials/0003/c",
        "3",
        "{other}",
    ]

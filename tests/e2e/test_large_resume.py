"""A state over 2 GiB saved by a real 2-rank job comes back bitwise on both ranks of a fresh one.

Restore used to pickle the whole state into one object whose size Horovod sends as an int32: over
2 GiB it failed on rank 0. Now tensors travel in bounded chunks. Memory: about 2.2 GiB per rank.
"""

import json

import pytest
from helpers import ROOT, run_ranks

pytestmark = pytest.mark.dist
SCRIPT = str(ROOT / "tests" / "e2e" / "scripts" / "large_state.py")


@pytest.fixture(scope="module")
def jobs(tmp_path_factory):
    out = tmp_path_factory.mktemp("large-resume")
    ckpt = out / "ckpt"
    records = {}
    for mode in ("save", "restore"):  # two separate jobs: the restore starts from nothing in memory
        proc = run_ranks("mpirun", 2, [SCRIPT, mode, str(ckpt), str(out)], timeout=600)
        assert proc.returncode == 0, f"{mode} job failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
        records[mode] = [json.loads((out / f"{mode}-rank{r}.json").read_text()) for r in (0, 1)]
    return records


def test_a_state_over_2_gib_restores_bitwise_on_both_ranks_of_a_fresh_job(jobs):
    saved = jobs["save"][0]
    assert saved["state_bytes"] > 2**31  # more than an int32 can count
    for r, rec in enumerate(jobs["restore"]):
        assert rec["before"] == {"count": 0, "momentum_buffers": 0}  # a fresh start, not the saved state
        assert rec["digest"] == saved["digest"], f"rank {r} did not restore the saved state bitwise"
        assert rec["resumed"] == [7, 2, {"note": "big"}]


def test_a_rank_receiving_the_state_needs_about_no_memory_beyond_the_state(jobs):
    # Rank 1 holds the model and its momentum (the state) plus the process itself (~0.4 GiB):
    # no pickled copy (the old path's pickle, its bytes and the unpickled state: 3x the state).
    rec = jobs["restore"][1]
    assert rec["peak_rss_bytes"] < rec["state_bytes"] + 2**30

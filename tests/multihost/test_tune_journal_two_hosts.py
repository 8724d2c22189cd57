"""Two `hvdkit tune` workers on two hosts (network namespaces, each with its own empty /tmp as separate
machines have) share one study through an Optuna journal file on a folder both see (as a cluster's
shared file system): together they finish exactly --trials trials, none twice, all in the one study.
Needs root (namespaces, mounts)."""

import shutil
import tempfile
from pathlib import Path

import pytest
from netns import NEEDS_HOSTS, open_hosts
from shared_study import SPACE, STUDY, TRIALS, check_one_study, run_two, worker_argv

pytestmark = [pytest.mark.dist, *NEEDS_HOSTS]
optuna = pytest.importorskip("optuna")


@pytest.fixture(scope="module")
def hosts():
    yield from open_hosts(private_tmp=True)  # checks that nothing the test made survives it


@pytest.fixture
def shared():
    """A folder both hosts see at the same path: outside /tmp, which each host has its own of."""
    path = Path(tempfile.mkdtemp(prefix="hvdkit-tune-shared-", dir="/var/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)
    assert not path.exists()


def test_two_hosts_share_one_journal_study_and_finish_exactly_n_trials(hosts, shared):
    space = shared / "space.yaml"
    space.write_text(SPACE)
    journal = shared / "study.journal"
    outs = [shared / f"out-{name}" for name in hosts.names]
    argvs = [hosts.argv_on(i, worker_argv(space, outs[i], str(journal), seed=i)) for i in (0, 1)]
    results = run_two(argvs)
    from hvdkit.tune.storage import open_storage

    study = optuna.load_study(storage=open_storage(str(journal), str(shared)), study_name=STUDY)
    ran = check_one_study(results, outs, study)
    # each worker wrote its trials' folders on its own host's side of the shared folder
    for out, numbers in zip(outs, ran):
        assert sorted(int(p.name) for p in (out / "trials").iterdir()) == sorted(
            int(t.user_attrs["hvdkit_key"]) for t in study.get_trials() if t.number in numbers
        )
    assert sum(map(len, ran)) >= TRIALS

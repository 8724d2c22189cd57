"""Two `hvdkit tune` workers on one study in PostgreSQL, for real: the test starts its own Debian
PostgreSQL server (as the postgres user, in a folder of its own, on a free loopback port), both
workers run at the same time with `--storage postgresql+psycopg2://...`, and together they finish
exactly --trials trials, none twice; the server is stopped and its folder removed afterwards."""

import os
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path

import pytest
from helpers import ROOT
from shared_study import SPACE, STUDY, TRIALS, check_one_study, run_two, worker_argv

pytestmark = pytest.mark.dist
optuna = pytest.importorskip("optuna")
psycopg2 = pytest.importorskip("psycopg2")
PG_BIN = Path("/usr/lib/postgresql/15/bin")


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _as_postgres(*argv, timeout=60):
    return subprocess.run(
        ["runuser", "-u", "postgres", "--", *map(str, argv)], capture_output=True, text=True, timeout=timeout
    )


@pytest.fixture(scope="module")
def postgres():
    """A running PostgreSQL server of this test's own; yields the SQLAlchemy URL of an empty database."""
    if os.geteuid() != 0:
        pytest.skip("starting PostgreSQL as the postgres user needs root (runuser)")
    if not (PG_BIN / "pg_ctl").exists():
        pytest.skip(f"needs Debian's postgresql (no {PG_BIN / 'pg_ctl'}; make setup installs it)")
    home = Path(tempfile.mkdtemp(prefix="hvdkit-pg-"))
    shutil.chown(home, "postgres", "postgres")
    data, port = home / "data", _free_port()
    started = False
    try:
        init = _as_postgres(PG_BIN / "initdb", "-D", data, "-A", "trust", "-U", "postgres", "--no-sync", timeout=120)
        assert init.returncode == 0, init.stdout + init.stderr
        opts = f"-p {port} -k {home} -c listen_addresses=127.0.0.1 -c fsync=off"
        start = _as_postgres(PG_BIN / "pg_ctl", "-D", data, "-o", opts, "-l", home / "server.log", "-w", "start")
        started = True
        assert start.returncode == 0, start.stdout + start.stderr + _read(home / "server.log")
        conn = psycopg2.connect(host="127.0.0.1", port=port, user="postgres", dbname="postgres")
        conn.autocommit = True
        with conn.cursor() as cur:
            cur.execute("CREATE DATABASE tune")
        conn.close()
        yield f"postgresql+psycopg2://postgres@127.0.0.1:{port}/tune"
    finally:
        if started:
            stop = _as_postgres(PG_BIN / "pg_ctl", "-D", data, "-m", "fast", "-w", "stop")
            assert stop.returncode == 0 or "Is server running?" in stop.stderr, stop.stderr
        shutil.rmtree(home, ignore_errors=True)
    assert not home.exists()


def _read(path):
    try:
        return path.read_text()
    except OSError:
        return ""


def test_two_workers_on_one_postgresql_study_finish_exactly_n_trials(postgres, tmp_path):
    space = tmp_path / "space.yaml"
    space.write_text(SPACE)
    outs = [tmp_path / "worker-a", tmp_path / "worker-b"]
    # each worker on its own core (hvdkit tune pins its trials within its own affinity)
    argvs = [["taskset", "-c", str(i % os.cpu_count()), *worker_argv(space, outs[i], postgres, seed=i)] for i in (0, 1)]
    results = run_two(argvs)
    study = optuna.load_study(storage=postgres, study_name=STUDY)
    ran = check_one_study(results, outs, study)
    assert sum(map(len, ran)) >= TRIALS


def test_a_postgresql_url_whose_server_is_not_there_names_the_url_and_the_fix(tmp_path):
    space = tmp_path / "space.yaml"
    space.write_text(SPACE)
    url = f"postgresql+psycopg2://postgres@127.0.0.1:{_free_port()}/none"
    argv = worker_argv(space, tmp_path / "o", url, seed=0)
    proc = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0
    assert f"--storage {url!r} cannot be opened" in proc.stderr, proc.stderr[-3000:]
    assert "OperationalError" in proc.stderr and "that its database server runs" in proc.stderr
    assert "Traceback" not in proc.stderr

"""No code runs through Horovod's launcher listeners (issue 27, item 2; CVE-2024-10190).

Upstream, the elastic rendezvous server unpickled (cloudpickle) the body of any HTTP PUT to
``/worker_addresses/<host>:<slot>``: anyone who could reach the port ran code on the launcher host.
The function store of ``horovod.run`` served and took pickles (the function, the results) from
anyone. Engine fix 03 (``03-rendezvous-and-kvstore-authenticated.patch``): a worker registration
is plain JSON signed (HMAC-SHA256) with the job's key, which the launcher gives only to the
processes it starts; the function store checks a signature on every request and signs its replies;
neither serves files (HEAD). Gloo's own keys stay as they were: opaque bytes nothing unpickles.
"""

import base64
import http.client
import json
import os
import pickle
import subprocess
import time
import urllib.error
import urllib.request

import pytest
from helpers import BIN, PYTHON, ROOT, end_job

pytestmark = pytest.mark.dist
SCRIPT = ROOT / "tests" / "engine" / "scripts" / "hvd_elastic_wait.py"


class _Planted:
    """Unpickling this runs ``touch PATH``: what an attacker's payload does."""

    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (os.system, (f"touch {self.path}",))


def _request(method, url, body=None, headers=None):
    req = urllib.request.Request(url, data=body, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status
    except urllib.error.HTTPError as e:
        return e.code
    except http.client.RemoteDisconnected:
        return "closed without a reply"  # the old engine's handler died unpacking what it unpickled


@pytest.fixture
def elastic_job(tmp_path):
    (tmp_path / "hosts").write_text("localhost:1\n127.0.0.1:1\n")  # two hosts: the old engine needs them to start
    discover = tmp_path / "discover.sh"
    discover.write_text(f"#!/bin/sh\ncat {tmp_path / 'hosts'}\n")
    discover.chmod(0o755)
    argv = [str(BIN / "horovodrun"), "-np", "1", "--min-np", "1", "--max-np", "1", "--elastic-timeout", "60"]
    argv += ["--host-discovery-script", str(discover), "--gloo", PYTHON, str(SCRIPT), str(tmp_path)]
    env = {k: v for k, v in os.environ.items() if not k.startswith("HOROVOD_")}
    proc = subprocess.Popen(
        argv, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )
    try:
        deadline = time.monotonic() + 120
        while not (tmp_path / "rendezvous.json").exists():
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate(timeout=30)[0][-3000:]
            time.sleep(0.2)
        where = json.loads((tmp_path / "rendezvous.json").read_text())
        yield proc, f"http://{where['addr']}:{where['port']}", tmp_path
    finally:
        (tmp_path / "go").touch()
        try:
            proc.wait(timeout=60)
        finally:
            end_job([], proc)


def test_a_forged_worker_registration_is_refused_and_its_pickle_never_runs(elastic_job):
    proc, url, out = elastic_job
    planted = out / "planted"
    payload = base64.b64encode(pickle.dumps((_Planted(planted), b"k")))
    unsigned = _request("PUT", f"{url}/worker_addresses/localhost:0", payload)
    forged = _request("PUT", f"{url}/worker_addresses/localhost:0", payload, {"X-Horovod-Digest": "0" * 64})
    time.sleep(1)
    assert not planted.exists()  # before the fix the server unpickled it: the file was there
    assert (unsigned, forged) == (403, 403)
    assert _request("HEAD", f"{url}/") == 405  # not a file server
    (out / "go").touch()
    output = proc.communicate(timeout=90)[0]
    assert proc.returncode == 0, output[-3000:]  # the job itself was not disturbed
    assert "ENDED 0" in output
    assert not planted.exists()


def test_the_function_store_refuses_unsigned_requests_and_signs_its_replies():
    from horovod.runner.common.util import secret
    from horovod.runner.http.http_client import put_data_into_kvstore, read_data_from_kvstore
    from horovod.runner.http.http_server import KVStoreServer

    key = secret.make_secret_key()
    server = KVStoreServer(verbose=0, key=key)
    port = server.start_server()
    try:
        url = f"http://127.0.0.1:{port}"
        payload = base64.b64encode(pickle.dumps(_Planted("/nonexistent/x")))
        assert _request("PUT", f"{url}/runfunc/func", payload) == 403
        assert _request("GET", f"{url}/runfunc/func") == 403
        assert _request("HEAD", f"{url}/runfunc/func") == 405
        put_data_into_kvstore("127.0.0.1", port, "runfunc", "func", {"value": 42}, key)
        assert read_data_from_kvstore("127.0.0.1", port, "runfunc", "func", key) == {"value": 42}
        with pytest.raises(RuntimeError, match="KVStore server failed"):  # a wrong key's GET: 403
            read_data_from_kvstore("127.0.0.1", port, "runfunc", "func", secret.make_secret_key())
        with pytest.raises(RuntimeError, match="KVStore server failed"):  # a wrong key's PUT: 403
            put_data_into_kvstore("127.0.0.1", port, "runfunc", "func", 1, secret.make_secret_key())
        assert read_data_from_kvstore("127.0.0.1", port, "runfunc", "func", key) == {"value": 42}  # unchanged
    finally:
        server.shutdown_server()


def test_a_worker_unpickles_nothing_a_server_without_the_jobs_key_replies():
    from horovod.runner.common.util import secret
    from horovod.runner.http.http_client import put_data_into_kvstore, read_data_from_kvstore
    from horovod.runner.http.http_server import KVStoreServer

    impostor = KVStoreServer(verbose=0)  # answers anything, signs nothing
    port = impostor.start_server()
    try:
        put_data_into_kvstore("127.0.0.1", port, "runfunc", "func", _Planted("/nonexistent/y"))
        with pytest.raises(RuntimeError, match="not signed with this job's key"):
            read_data_from_kvstore("127.0.0.1", port, "runfunc", "func", secret.make_secret_key())
    finally:
        impostor.shutdown_server()

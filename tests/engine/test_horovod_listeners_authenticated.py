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
import hashlib
import hmac
import http.client
import json
import os
import pickle
import secrets
import socketserver
import struct
import subprocess
import threading
import time
import urllib.error
import urllib.request

import pytest
from helpers import BIN, PYTHON, ROOT, end_job
from other_user import NEEDS_ROOT, read_as_nobody, where

pytestmark = pytest.mark.dist
SCRIPT = ROOT / "tests" / "engine" / "scripts" / "hvd_elastic_wait.py"
TOKEN = "tok-" + secrets.token_hex(16)


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
    env["MY_API_TOKEN"] = TOKEN  # a secret of the launching shell: no other user may read it
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


def _sign(key, path, body):
    return {"X-Horovod-Digest": hmac.new(key, b"PUT " + path.encode() + b"\n" + body, hashlib.sha256).hexdigest()}


def _derived_key(job_key, worker_id):
    """A worker's notification key as the fixed engine derives it on both sides (``secret.worker_key``)."""
    return hmac.new(job_key, b"worker-notification " + worker_id.encode(), hashlib.sha256).digest()


def _registration(port, its_key, nonce):
    """A worker registration naming 127.0.0.1:``port``; ``secret_key`` is what the old engine took the
    worker's key from (the fixed one derives it and ignores the field), ``nonce`` what the fixed one checks."""
    addresses = {"lo": [["127.0.0.1", port]]}
    return json.dumps(
        {"addresses": addresses, "secret_key": base64.b64encode(its_key).decode(), "nonce": nonce}
    ).encode()


def _listener(reply_key, reply):
    """A TCP listener that answers anything with ``reply`` pickled and signed with ``reply_key`` (Horovod's
    wire format: digest, length, body): what a thief's fake worker service would send the driver."""
    body = pickle.dumps(reply)
    message = hmac.new(reply_key, body, hashlib.sha256).digest() + struct.pack("i", len(body)) + body

    class Handler(socketserver.BaseRequestHandler):
        def handle(self):
            self.request.settimeout(5)
            try:
                self.request.recv(65536)
                self.request.sendall(message)
            except OSError:
                pass

    server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def _oversized_put(url, path):
    """A PUT announcing 64 MiB and sending none of it: the fixed server refuses it before reading (413)."""
    host, port = url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    try:
        conn.putrequest("PUT", path)
        conn.putheader("Content-Length", str(64 << 20))
        conn.endheaders()
        return conn.getresponse().status
    except (http.client.RemoteDisconnected, ConnectionResetError):
        return "closed without a reply"
    finally:
        conn.close()


@NEEDS_ROOT
def test_no_key_or_token_is_readable_by_another_user_and_a_stolen_key_runs_no_code(elastic_job):
    """Engine fix 08. Upstream's Gloo launcher ran each worker as ``sh -c "env NAME=VALUE ... python ..."``,
    and that shell lived as long as the worker: the job's rendezvous key and every variable of the
    launching shell were in a command line every local user can read. With the key, a registration
    naming the thief's own address and own key made the driver unpickle what that address replied."""
    from horovod.runner.elastic.worker import WorkerNotificationService

    proc, url, out = elastic_job
    job = json.loads((out / "rendezvous.json").read_text())
    key_text = job["key"]
    assert key_text and TOKEN not in key_text

    # 1. Another user reads every command line (and the environments it may read): no key, no token.
    seen = read_as_nobody()
    assert str(SCRIPT) in seen  # it could read the job's command lines...
    assert key_text not in seen, where(seen, key_text)  # ...and neither secret is in them (before the fix: both were)
    assert TOKEN not in seen, where(seen, TOKEN)

    # 2. A registration signed with the (stolen) key, naming the thief's address and key: no unpickle.
    key = base64.b64decode(key_text)
    planted = out / "planted"
    thief_key = secrets.token_bytes(32)
    thief = _listener(thief_key, _Planted(planted))
    try:
        path = f"/worker_addresses/{job['host']}:5"
        body = _registration(thief.server_address[1], thief_key, secrets.token_hex(16))
        _request("PUT", url + path, body, _sign(key, path, body))
        time.sleep(1)
        assert not planted.exists()  # before the fix the driver unpickled the thief's reply: the file was there
    finally:
        thief.shutdown()
        thief.server_close()

    # 3. A genuine registration (a worker service holding the derived key) is taken once; the same bytes
    #    again (captured and replayed) are refused.
    worker_id = f"{job['host']}:6"
    service = WorkerNotificationService(_derived_key(key, worker_id), "lo", None)
    try:
        path = f"/worker_addresses/{worker_id}"
        body = _registration(service.get_port(), _derived_key(key, worker_id), secrets.token_hex(16))
        first = _request("PUT", url + path, body, _sign(key, path, body))
        replayed = _request("PUT", url + path, body, _sign(key, path, body))
        assert (first, replayed) == (200, 403)  # before the fix the replay was taken too: (200, 200)
    finally:
        service.shutdown()

    # 4. A digest header that is not ASCII is a mismatch (it raised in compare_digest), and a body over
    #    the registration bound is refused before it is read (the old server waited to read it all).
    path = f"/worker_addresses/{job['host']}:7"
    assert _request("PUT", url + path, b"{}", {"X-Horovod-Digest": "\u00e9" * 64}) == 403
    assert _oversized_put(url, path) == 413

    (out / "go").touch()
    output = proc.communicate(timeout=90)[0]
    assert proc.returncode == 0, output[-3000:]  # the job itself was not disturbed
    assert "ENDED 0" in output
    assert not planted.exists()

"""hvdkit.core.monitoring.tracking in one process: our CRC-32C and event files as TensorBoard reads them, MLflow runs, errors."""

import os
import random
import struct
import subprocess
import sys

import pytest

pytest.importorskip("tensorboard")
import tensorboard.compat  # noqa: E402
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator  # noqa: E402

import hvdkit  # noqa: E402
from hvdkit.core import ConfigError, LocalCommunicator, MissingDependencyError  # noqa: E402
from hvdkit.core.monitoring.tracking import Tracker, crc32c, masked_crc32c  # noqa: E402

# TensorBoard reads records with TensorFlow's reader (CRCs checked) when TensorFlow is installed.
# Importing TensorFlow sets environment variables, so do it now, at collection, not inside a test.
assert tensorboard.compat.tf.__version__


class FakeComm:
    """Just a rank and a size: the tracker must not call any collective (these would fail)."""

    def __init__(self, rank, size):
        self.rank, self.size = rank, size

    def __getattr__(self, name):
        raise AssertionError(f"the tracker called the collective {name!r}")


def read_events(log_dir):
    acc = EventAccumulator(str(log_dir))
    acc.Reload()
    return acc


def raw_records(path):
    """Every record's data, checking the framing (lengths and masked CRCs) on the way."""
    data, out, i = open(path, "rb").read(), [], 0
    while i < len(data):
        header = data[i : i + 8]
        (n,) = struct.unpack("<Q", header)
        (len_crc,) = struct.unpack("<I", data[i + 8 : i + 12])
        body = data[i + 12 : i + 12 + n]
        (body_crc,) = struct.unpack("<I", data[i + 12 + n : i + 16 + n])
        assert (len_crc, body_crc) == (masked_crc32c(header), masked_crc32c(body))
        out.append(body)
        i += 16 + n
    return out


def test_crc32c_gives_the_published_check_values():
    assert crc32c(b"123456789") == 0xE3069283  # the CRC catalogue's check value
    assert crc32c(b"") == 0
    # RFC 3720 (iSCSI), appendix B.4
    assert crc32c(bytes(32)) == 0x8A9136AA
    assert crc32c(b"\xff" * 32) == 0x62A8AB43
    assert crc32c(bytes(range(32))) == 0x46DD794E
    assert crc32c(b"56789", crc32c(b"1234")) == 0xE3069283  # continues a running CRC


def test_masked_crc_agrees_with_tensorboards_reference_implementation():
    from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import masked_crc32c as reference

    rng = random.Random(3)
    for n in (0, 1, 7, 8, 100, 4096):
        blob = bytes(rng.randrange(256) for _ in range(n))
        assert masked_crc32c(blob) == reference(blob)


def test_tensorboard_reads_back_every_scalar_at_its_step(tmp_path):
    loss = [2.0, 1.5, 0.75, 0.3125]  # exact in float32, as TensorBoard stores scalars
    with Tracker(LocalCommunicator(), tmp_path, params={"lr": 0.1}) as tr:
        for step, v in enumerate(loss):
            tr.log_metrics({"loss": v, "accuracy": step / 4}, step=step * 10)
    acc = read_events(tmp_path)
    assert [(e.step, e.value) for e in acc.Scalars("loss")] == [(s * 10, v) for s, v in enumerate(loss)]
    assert [e.value for e in acc.Scalars("accuracy")] == [0.0, 0.25, 0.5, 0.75]
    assert os.path.basename(tr.event_file).startswith("events.out.tfevents.")
    assert tr.event_file.endswith(f".{os.getpid()}.hvdkit")
    from tensorboard.compat.proto import event_pb2

    first = event_pb2.Event.FromString(raw_records(tr.event_file)[0])
    assert first.file_version == "brain.Event:2"


def test_params_and_world_size_go_to_tensorboards_text_and_hparams_plugins(tmp_path):
    from tensorboard.plugins.hparams import plugin_data_pb2

    with Tracker(FakeComm(0, 4), tmp_path, params={"lr": 0.05, "optimizer": "sgd", "nesterov": True}) as tr:
        tr.log_metrics({"loss": 1.0}, step=0)
    acc = read_events(tmp_path)
    table = acc.Tensors("params")[0].tensor_proto.string_val[0].decode()
    assert "| world_size | 4 |" in table and "| lr | 0.05 |" in table and "| optimizer | sgd |" in table
    content = acc.PluginTagToContent("hparams")
    start = plugin_data_pb2.HParamsPluginData.FromString(content["_hparams_/session_start_info"]).session_start_info
    assert start.hparams["world_size"].number_value == 4
    assert start.hparams["lr"].number_value == 0.05 and start.hparams["nesterov"].bool_value is True
    end = plugin_data_pb2.HParamsPluginData.FromString(content["_hparams_/session_end_info"]).session_end_info
    assert end.status == 1  # STATUS_SUCCESS


def test_ranks_other_than_0_write_nothing_but_check_their_inputs(tmp_path):
    log_dir = tmp_path / "run"
    tr = Tracker(FakeComm(1, 2), log_dir, backends=("tensorboard", "mlflow"), params={"lr": 0.1})
    tr.log_metrics({"loss": 0.5}, step=0)
    with pytest.raises(ConfigError, match="metric 'loss' is nan"):
        tr.log_metrics({"loss": float("nan")}, step=1)
    tr.close()
    assert not log_dir.exists()
    assert tr.event_file is None and tr.mlflow_run_id is None
    assert tr.params["world_size"] == 2


def mlflow_client(tmp_path):
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")


def test_mlflow_run_in_local_sqlite_holds_params_metrics_and_ends_finished(tmp_path):
    with Tracker(FakeComm(0, 2), tmp_path, backends=("mlflow",), params={"lr": 0.1, "batch": 32}) as tr:
        for step in range(3):
            tr.log_metrics({"loss": 1.0 / (step + 1), "val_loss": 2.0 / (step + 1)}, step=step)
    client = mlflow_client(tmp_path)
    run = client.get_run(tr.mlflow_run_id)
    assert run.info.status == "FINISHED"
    assert run.info.run_name == tmp_path.name
    assert client.get_experiment(run.info.experiment_id).name == "hvdkit"
    p = run.data.params
    assert (p["lr"], p["batch"], p["world_size"], p["hvdkit_version"]) == ("0.1", "32", "2", hvdkit.__version__)
    history = client.get_metric_history(tr.mlflow_run_id, "loss")
    assert sorted((m.step, m.value) for m in history) == [(0, 1.0), (1, 0.5), (2, 1.0 / 3)]
    assert run.data.metrics["val_loss"] == pytest.approx(2.0 / 3, rel=1e-15)
    assert tr.event_file is None  # tensorboard was not asked for
    assert sorted(os.listdir(tmp_path)) == ["mlflow.db"]


def test_an_exception_in_the_with_block_ends_the_run_failed(tmp_path):
    with pytest.raises(RuntimeError, match="boom"):
        with Tracker(LocalCommunicator(), tmp_path, backends=("mlflow", "tensorboard"), run_name="r1") as tr:
            tr.log_metrics({"loss": 1.0}, step=0)
            raise RuntimeError("boom")
    run = mlflow_client(tmp_path).get_run(tr.mlflow_run_id)
    assert (run.info.status, run.info.run_name) == ("FAILED", "r1")
    from tensorboard.plugins.hparams import plugin_data_pb2

    content = read_events(tmp_path).PluginTagToContent("hparams")["_hparams_/session_end_info"]
    assert plugin_data_pb2.HParamsPluginData.FromString(content).session_end_info.status == 2  # STATUS_FAILURE


def test_a_file_uri_gets_mlflows_file_store_allowed(tmp_path, monkeypatch):
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "x")  # recorded, so the test leaves the variable as it was
    monkeypatch.delenv("MLFLOW_ALLOW_FILE_STORE")
    uri = f"file://{tmp_path / 'mlruns'}"
    with Tracker(LocalCommunicator(), tmp_path / "logs", backends=("mlflow",), mlflow_uri=uri) as tr:
        tr.log_metrics({"loss": 0.25}, step=3)
    assert os.environ["MLFLOW_ALLOW_FILE_STORE"] == "true"
    from mlflow.tracking import MlflowClient

    run = MlflowClient(tracking_uri=uri).get_run(tr.mlflow_run_id)
    assert run.data.metrics == {"loss": 0.25} and run.info.status == "FINISHED"


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda tr: tr.log_metrics({"loss": float("inf")}, step=0), "metric 'loss' is inf at step 0"),
        (lambda tr: tr.log_metrics({"acc": "0.9"}, step=0), "metric 'acc' must be a number (got str"),
        (lambda tr: tr.log_metrics({"acc": None}, step=0), "metric 'acc' must be a number (got NoneType"),
        (lambda tr: tr.log_metrics({"loss": 1.0}, step=-1), "step must be an integer >= 0 (got -1)"),
        (lambda tr: tr.log_metrics({"loss": 1.0}, step=1.5), "step must be an integer >= 0 (got 1.5)"),
        (lambda tr: tr.log_params({"lr": 0.2}), "parameter 'lr' was logged as 0.1, now 0.2"),
        (lambda tr: tr.log_params({"world_size": 3}), "parameter 'world_size' was logged as 1, now 3"),
        (lambda tr: tr.log_params(["lr"]), "params must be a mapping"),
    ],
)
def test_bad_values_are_config_errors_that_name_them(tmp_path, call, message):
    with Tracker(LocalCommunicator(), tmp_path, params={"lr": 0.1}) as tr:
        with pytest.raises(ConfigError) as info:
            call(tr)
    assert message in str(info.value)


def test_an_unknown_backend_is_named_with_the_allowed_ones(tmp_path):
    with pytest.raises(ConfigError, match=r"unknown tracking backend 'wandb'; choose from tensorboard, mlflow"):
        Tracker(LocalCommunicator(), tmp_path, backends=("tensorboard", "wandb"))
    assert list(tmp_path.iterdir()) == []  # checked before anything was created


def test_logging_after_close_is_an_error_and_closing_twice_is_not(tmp_path):
    tr = Tracker(LocalCommunicator(), tmp_path)
    tr.log_params({"seed": 1})
    tr.close()
    tr.close()
    with pytest.raises(ConfigError, match="is closed"):
        tr.log_metrics({"loss": 1.0}, step=0)
    assert read_events(tmp_path).Tensors("params")[0].tensor_proto.string_val[0].decode().count("| seed | 1 |") == 1


def test_a_missing_backend_package_is_a_missing_dependency_error_with_the_fix(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "mlflow.tracking", None)  # what an absent package looks like to import
    with pytest.raises(MissingDependencyError, match=r"mlflow.*make setup.*pip install tensorboard mlflow-skinny"):
        Tracker(LocalCommunicator(), tmp_path / "m", backends=("mlflow",))
    monkeypatch.setitem(sys.modules, "tensorboard.compat.proto", None)
    with pytest.raises(MissingDependencyError, match=r"tensorboard.*make setup"):
        Tracker(LocalCommunicator(), tmp_path / "t")


def test_importing_core_tracking_and_writing_loads_no_framework(tmp_path):
    code = (
        "import sys; from hvdkit.core.monitoring.tracking import Tracker; from hvdkit.core import LocalCommunicator\n"
        f"with Tracker(LocalCommunicator(), {str(tmp_path)!r}) as t: t.log_metrics({{'loss': 1.0}}, step=0)\n"
        "print(sorted(m for m in ('torch', 'tensorflow', 'horovod', 'keras') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
    assert len(os.listdir(tmp_path)) == 1  # the event file was written

"""``python -m hvdkit.bench.ckpt_bench --async --free-core``: the step times with every core and with one thread."""

import json

import torch

from hvdkit.bench import ckpt_bench
from hvdkit.core.checkpoint import arrays

# torch's first optimizer of a process sets TORCHINDUCTOR_CACHE_DIR, which the env-leak check would
# report against the first test here: make it at import
torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1)


def test_free_core_times_the_steps_on_one_torch_thread_beside_all_threads_and_puts_the_count_back(tmp_path):
    threads = torch.get_num_threads()
    out = tmp_path / "async.json"
    ckpt_bench.main([str(out), "--async", "--quick", "--free-core", "--pieces", "--dir", str(tmp_path)])
    result = json.loads(out.read_text())
    assert torch.get_num_threads() == threads
    assert result["step_time"]["torch_threads"] == threads
    assert result["step_time_free_core"]["torch_threads"] == 1
    assert result["step_time_free_core"]["step"].endswith("torch threads 1")
    for key in ("step_time", "step_time_free_core"):
        for way, (_, direct_io) in ckpt_bench.WRITERS.items():
            assert len(result[key][way]["steps_per_write"]) == 1  # --quick: one write per way
            assert result[key][way]["direct_io"] is direct_io is way.endswith("_direct")
        assert len(result[key]["no_write"]["samples_s"]) >= 20
    assert result["o_direct_taken"] in (True, False)
    assert result["results"]["1"]["checks"] == {"sync": 0.0, "async_copy_in_save": 0.0, "async": 0.0}
    pieces = result["pieces_before_vs_now"]
    assert pieces["pieces"] == {"before": [4 << 20, 0], "now": [256 << 10, 8]}
    for variant in ("before", "now"):
        assert len(pieces[variant]["write_cpu_s_per_gib"]) == 1
    assert (arrays._CHUNK, arrays._HASH_LAG) == (256 << 10, 8)  # put back after the comparison


def test_without_free_core_only_the_all_threads_step_times_are_recorded(tmp_path):
    out = tmp_path / "async.json"
    ckpt_bench.main([str(out), "--async", "--quick", "--dir", str(tmp_path)])
    result = json.loads(out.read_text())
    assert "step_time_free_core" not in result and "pieces_before_vs_now" not in result
    assert result["step_time"]["torch_threads"] == torch.get_num_threads()


def test_quick_leaves_out_the_sync_before_each_sample_and_a_measurement_keeps_it(tmp_path, monkeypatch):
    """os.sync() waits for every process's writeback: beside the suite's jobs it made --quick take a minute."""
    calls = []
    monkeypatch.setattr(ckpt_bench.os, "sync", lambda: calls.append(1))
    ckpt_bench.main([str(tmp_path / "quick.json"), "--async", "--quick", "--dir", str(tmp_path)])
    assert calls == [] and ckpt_bench._SYNC_BEFORE_SAMPLES is True  # put back for the next run
    ckpt_bench._settle()  # what every sample of a measurement (no --quick) calls first
    assert calls == [1]

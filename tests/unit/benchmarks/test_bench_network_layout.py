"""The network benchmark's (benchmarks.network) arithmetic and argument checks, without namespaces or ranks."""

import pytest

from benchmarks.netns import format_rate, parse_rate
from benchmarks.network import check_ready
from benchmarks.network_report import compression_rows, tuned_summary
from benchmarks.tcp_stream import receive, send
from hvdkit.core.errors import ConfigError


@pytest.mark.parametrize(
    "text,bits",
    [("1gbit", 10**9), ("10Gbit", 10**10), ("500mbit", 5 * 10**8), ("2.5gbit", 25 * 10**8), ("unlimited", None)],
)
def test_link_rates_parse_to_bits_per_second_and_back(text, bits):
    assert parse_rate(text) == bits
    assert parse_rate(format_rate(bits)) == bits


@pytest.mark.parametrize("bad", ["fast", "-1gbit", "gbit", ""])
def test_a_bad_link_rate_is_an_error_naming_it(bad):
    with pytest.raises(ConfigError, match=f"got {bad!r}"):
        parse_rate(bad)


def test_a_bad_rate_or_a_page_without_the_network_markers_stops_the_run_before_anything_starts(tmp_path):
    with pytest.raises(ConfigError, match="got 'fast'"):
        check_ready(("1gbit", "fast"))
    page = tmp_path / "benchmarks.md"
    page.write_text("<!-- bench:results:begin -->\n<!-- bench:results:end -->\n")
    with pytest.raises(ConfigError, match="bench:network:begin"):
        check_ready(("1gbit",), str(page))


def _job(steps, auto=None, margin=0.1):
    out = {"variants": {v: {"median_s": s} for v, s in steps.items()}}
    if auto:
        out["auto_compression"] = {"choice": auto, "fp32_s": 1.0, "fp16_s": 1.0, "margin": margin}
    return out


def test_tuned_summary_pairs_each_repetition_and_uses_the_variant_auto_picked():
    default = [
        _job({"single": 0.1, "hvdkit": 0.30, "hvdkit_fp16": 0.20}),
        _job({"single": 0.1, "hvdkit": 0.33, "hvdkit_fp16": 0.2}),
    ]
    tuned = [
        _job({"single": 0.2, "hvdkit": 0.25, "hvdkit_fp16": 0.15}, "fp16"),
        _job({"single": 0.1, "hvdkit": 0.30, "hvdkit_fp16": 0.165}, "fp16"),
    ]
    s = tuned_summary({"horovod defaults": default, "hvdkit defaults": tuned})
    assert s["engine_settings"]["samples"] == pytest.approx([0.30 / 0.25, 0.33 / 0.30])
    # a job whose whole machine ran twice as slow (single 0.2 s) counts against its single-process step
    assert s["engine_settings_per_single"]["samples"] == pytest.approx([(0.30 / 0.1) / (0.25 / 0.2), 0.33 / 0.30])
    assert s["with_auto"]["samples"] == pytest.approx([2.0, 2.0])
    assert s["fp16_gain"]["ratio"] == pytest.approx((0.25 / 0.15 + 0.30 / 0.165) / 2)
    assert s["auto_choices"] == ["fp16", "fp16"]


def test_auto_counts_as_picking_the_faster_step_or_fp32_within_its_margin():
    def results(fp32, fp16, choice):
        return {"links": {"1gbit": {"train": _job({"hvdkit": fp32, "hvdkit_fp16": fp16}, choice)}}}

    assert compression_rows(results(0.3, 0.2, "fp16"))[0]["picked_faster"] is True
    assert compression_rows(results(0.3, 0.2, "none"))[0]["picked_faster"] is False
    assert compression_rows(results(0.20, 0.19, "none"))[0]["picked_faster"] is True  # 5 % < the 10 % margin
    assert compression_rows(results(0.2, 0.3, "fp16"))[0]["picked_faster"] is False


def test_the_tcp_stream_counts_every_byte_the_sender_wrote():
    import threading

    port = {}
    ready = threading.Event()
    result = {}

    def server():
        import socket

        with socket.socket() as s:  # a free port, then let receive() bind it
            s.bind(("127.0.0.1", 0))
            port["p"] = s.getsockname()[1]
        result.update(receive("127.0.0.1", port["p"], ready=ready.set, timeout=30))

    t = threading.Thread(target=server)
    t.start()
    assert ready.wait(30)
    sent = send("127.0.0.1", port["p"], 0.2)
    t.join(30)
    # the receiver's clock starts after the first block, so it counts all but that block
    assert result["bytes"] + (1 << 20) >= sent > result["bytes"] > 0 and result["bits_per_s"] > 0

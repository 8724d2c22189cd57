"""ZeRO-1 benchmark section, the pure parts: ring wire bytes, /proc/net/dev, the memory and step model, the summary."""

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from benchmarks.model import Link, Step, simulate, zero_memory, zero_step
from benchmarks.zero_predict import zero_prediction, zero_table
from hvdkit.bench.report import zero_summary
from hvdkit.bench.stats import ring_bytes_sent
from hvdkit.bench.zero_bench import net_dev, proc_status

MB = 2**20


def test_ring_collectives_send_their_closed_forms():
    assert ring_bytes_sent("allreduce", 100 * MB, 4) == 2 * 3 / 4 * 100 * MB
    assert ring_bytes_sent("reducescatter", 100 * MB, 4) == 3 / 4 * 100 * MB
    assert ring_bytes_sent("allgather", 100 * MB, 2) == 50 * MB
    assert ring_bytes_sent("allreduce", 100 * MB, 1) == 0.0


@given(nbytes=st.integers(0, 2**40), size=st.integers(1, 4096))
def test_reduce_scatter_plus_all_gather_send_the_bytes_of_one_allreduce(nbytes, size):
    rs = ring_bytes_sent("reducescatter", nbytes, size)
    ag = ring_bytes_sent("allgather", nbytes, size)
    allreduce = ring_bytes_sent("allreduce", nbytes, size)
    assert rs + ag == pytest.approx(allreduce, rel=1e-12, abs=1e-9)
    assert 0 <= allreduce < 2 * nbytes or nbytes == 0


@pytest.mark.parametrize(
    "args,match",
    [
        (("broadcast", 10, 2), "collective must be one of"),
        (("allreduce", 10, 0), "size must be an integer >= 1 \\(got 0\\)"),
        (("allreduce", 10, 2.0), "size must be an integer"),
        (("allreduce", -1, 2), "nbytes must be >= 0 \\(got -1\\)"),
    ],
)
def test_bad_ring_arguments_are_named(args, match):
    with pytest.raises(ValueError, match=match):
        ring_bytes_sent(*args)


NET_DEV = """\
Inter-|   Receive                                                |  Transmit
 face |bytes    packets errs drop fifo frame compressed multicast|bytes    packets errs drop fifo colls carrier compressed
    lo: 42081488    1234    0    0    0     0          0         0 42081400    1234    0    0    0     0       0          0
  eth0: 5 6 0 0 0 0 0 0 7 8 0 0 0 0 0 0
"""


def test_proc_status_reads_several_keys_from_one_moment():
    block = bytearray(32 << 20)  # 32 MiB resident: VmRSS is well above zero
    block[::4096] = b"\1" * len(block[::4096])
    for _ in range(50):  # the kernel's VmHWM is at least VmRSS within one read (two reads could cross)
        peak, rss = proc_status("VmHWM", "VmRSS")
        assert peak >= rss > len(block)
    assert proc_status("VmRSS") > len(block)
    with pytest.raises(KeyError, match="NoSuchKey"):
        proc_status("VmRSS", "NoSuchKey")


def test_net_dev_reads_received_and_sent_bytes_per_interface():
    assert net_dev(NET_DEV) == {"lo": (42081488, 42081400), "eth0": (5, 7)}


def test_a_line_that_is_not_an_interface_line_is_named():
    with pytest.raises(ValueError, match="not a /proc/net/dev interface line: 'lo: 1 2 3'"):
        net_dev(NET_DEV.splitlines()[0] + "\n" + NET_DEV.splitlines()[1] + "\nlo: 1 2 3\n")


names = st.text("abcdefghijklmnopqrstuvwxyz0123456789_-.", min_size=1, max_size=15)
counters = st.lists(st.integers(0, 2**64 - 1), min_size=16, max_size=16)


@given(st.dictionaries(names, counters, min_size=1, max_size=6), st.sampled_from([" ", "  ", "\t"]))
def test_net_dev_reads_back_every_interface_it_is_given(table, sep):
    text = "head 1\nhead 2\n" + "".join(f"{n:>6}:{sep}" + sep.join(map(str, v)) + "\n" for n, v in table.items())
    assert net_dev(text) == {n: (v[0], v[8]) for n, v in table.items()}


# ---------------------------------------------------------------- memory and step model
def test_adam_memory_per_rank_drops_from_16_to_8_plus_8_over_n_bytes_a_parameter():
    one = zero_memory(1e6, 1)
    assert one["plain"] == one["sharded"] == 16e6 and one["ratio"] == 1.0
    two = zero_memory(1e6, 2)
    assert two["plain"] == 16e6 and two["sharded"] == 12e6 and two["ratio"] == 0.75
    assert zero_memory(1e6, 512)["ratio"] == pytest.approx(0.5 + 0.5 / 512)


def test_hvdkits_slice_copy_eats_the_saving_at_two_ranks_and_its_transients_exceed_it():
    # A copy of the slice and its gradient (8 B per parameter of the slice) cancels 8/2 B of state saved.
    steady = zero_memory(1e6, 2, shard_copy_bytes=8)
    assert steady["sharded"] == steady["plain"]
    peak = zero_memory(1e6, 2, shard_copy_bytes=8, transient_bytes=4)
    assert peak["ratio"] == 1.25


@given(
    params=st.integers(0, 10**12),
    p=st.integers(1, 4096),
    copy=st.sampled_from([0, 4, 8]),
    transient=st.sampled_from([0, 4]),
)
def test_sharded_memory_never_grows_with_more_ranks_and_never_falls_below_weights_and_grads(params, p, copy, transient):
    a = zero_memory(params, p, shard_copy_bytes=copy, transient_bytes=transient)
    b = zero_memory(params, p + 1, shard_copy_bytes=copy, transient_bytes=transient)
    assert b["sharded"] <= a["sharded"] + 1e-6 * max(1, params)
    assert a["sharded"] >= 8 * params and a["plain"] == 16 * params


@pytest.mark.parametrize("p", [0, -1, 2.5])
def test_memory_model_names_a_bad_rank_count(p):
    with pytest.raises(ValueError, match=f"p must be an integer >= 1 \\(got {p}\\)"):
        zero_memory(1e6, p)


def test_zero_step_is_the_unoverlapped_ring_plus_one_nth_of_the_update():
    step, link, p = Step(100e6, 0.2), Link(1e9, 1e-5), 8
    got = zero_step(step, 0.08, p, link)
    assert got["plain"]["step_s"] == pytest.approx(simulate(step, p, link)["step_s"] + 0.08)
    assert got["sharded"]["step_s"] == pytest.approx(simulate(step.with_(overlap=False), p, link)["step_s"] + 0.01)
    assert got["plain"]["efficiency"] == pytest.approx(0.28 / got["plain"]["step_s"])


def test_with_a_free_network_sharding_beats_one_process_by_splitting_the_update():
    got = zero_step(Step(100e6, 0.2), 0.2, 4, Link(math.inf, 0.0))
    assert got["plain"]["efficiency"] == pytest.approx(1.0)
    assert got["sharded"]["efficiency"] == pytest.approx(0.4 / 0.25)
    assert zero_step(Step(100e6, 0.2), 0.2, 1, Link(1e9))["sharded"]["efficiency"] == 1.0


# ---------------------------------------------------------------- the section's summary and prediction
def _section(params=1000, state=(8000, 4000), peak=(100_000, 90_000), wire=(4000.0, 4040.0), netns=True):
    def part(v, i):
        ranks = [
            {
                "rss_model_bytes": 50_000,
                "peak_rss_bytes": peak[i] + r,
                "rss_end_bytes": 70_000,
                "state_bytes": state[i],
                "peak_reset": True,
            }
            for r in (0, 10)
        ]
        w = {"raw_bytes_per_rank_per_step": wire[i], "bytes_per_rank_per_step": wire[i] - 10} if netns else None
        return {"variant": v, "step_s": 0.5 + i, "ranks": ranks, "peak_growth_bytes": [1, 2], "wire": w}

    return {
        "time": {
            "model": {"parameters": params},
            "variants": {"plain": {"median_s": 0.2, "spread": 0.1}, "sharded": {"median_s": 0.25, "spread": 0.2}},
            "ring_bytes_sent_per_step": {"plain": 4000.0, "sharded": 4000.0},
            "compute_only": {"forward_backward_s": 0.02, "adam_step_s": 0.03},
            "checks": {"sharded_vs_plain_rel": 0.0},
        },
        "plain": part("plain", 0),
        "sharded": part("sharded", 1),
        "netns": netns,
    }


def test_summary_takes_the_largest_rank_and_divides_sharded_by_plain():
    z = zero_summary(_section())
    assert z["variants"]["plain"]["peak_rss_bytes"] == 100_010
    assert z["state_ratio"] == 0.5 and z["peak_ratio"] == 90_010 / 100_010
    assert z["throughput_ratio"] == pytest.approx(0.8) and z["wire_ratio"] == 1.01
    assert z["variants"]["sharded"]["gloo_step_s"] == 1.5


def test_summary_without_a_network_namespace_has_no_wire_ratio():
    z = zero_summary(_section(netns=False))
    assert z["wire_ratio"] is None and z["variants"]["plain"]["wire_bytes"] is None


def test_prediction_at_8_to_512_ranks_halves_the_memory_and_lists_every_rate():
    z = zero_prediction(_section(params=25_000_000))
    assert list(z["memory_bytes"]) == ["8", "16", "32", "64", "128", "256", "512"]
    row = z["memory_bytes"]["512"]
    assert row["plain"] == 16 * 25e6 and row["sharded"] == pytest.approx((8 + 8 / 512) * 25e6)
    assert row["hvdkit_peak"] == pytest.approx((8 + 8 / 512) * 25e6)  # flat buffers: no copies besides the state
    assert set(z["rates"]) == {"10", "25", "100"}
    text = "\n".join(zero_table(z))
    assert "25 Gbit/s ms sharded" in text and "1.5 B GB plain" in text and z["comm_factor"] == 1.0
    ring = z["rates"]["10"]["512"]["sharded"]["step_s"]
    assert z["rates_measured_factor"]["10"]["512"]["step_s"] == ring  # no comm_only: the ring's factor 1


def test_a_measured_comm_factor_scales_the_sharded_communication_only():
    section = _section(params=25_000_000)
    section["time"]["comm_only"] = {"allreduce": {"median_s": 0.5}, "reducescatter_allgather": {"median_s": 1.0}}
    z = zero_prediction(section)
    assert z["comm_factor"] == 2.0
    step, link = Step(25_000_000 * 4, 0.02), Link.gbit(10, 10e-6)
    comm = simulate(step.with_(overlap=False), 64, link)["comm_s"]
    ring = z["rates"]["10"]["64"]["sharded"]["step_s"]
    assert z["rates_measured_factor"]["10"]["64"]["step_s"] == pytest.approx(ring + comm)
    assert z["rates_measured_factor"]["10"]["64"]["step_s"] > ring
    with pytest.raises(ValueError, match="comm_factor must be > 0 \\(got 0\\)"):
        zero_step(step, 0.03, 2, link, comm_factor=0)

"""The benchmark suite's arithmetic and reporting, on numbers with known answers."""

import json
import math

import pytest

from hvdkit.bench import report
from hvdkit.bench.jobs import busy_warning
from hvdkit.bench.stats import BenchmarkCheckError, Samples, bus_bandwidth, check_close, interleaved, iterations_for


def test_bus_bandwidth_is_algorithm_bandwidth_times_two_n_minus_one_over_n():
    # 64 MB in 0.1 s = 671 MB/s algorithm bandwidth; 2 ranks: x1, 4 ranks: x1.5, 8 ranks: x1.75
    assert bus_bandwidth(64 << 20, 0.1, 2) == pytest.approx((64 << 20) / 0.1)
    assert bus_bandwidth(64 << 20, 0.1, 4) == pytest.approx((64 << 20) / 0.1 * 1.5)
    assert bus_bandwidth(64 << 20, 0.1, 8) == pytest.approx((64 << 20) / 0.1 * 1.75)
    assert math.isnan(bus_bandwidth(1, 0.0, 2))


def test_samples_report_median_and_relative_spread():
    s = Samples([0.30, 0.10, 0.20])
    assert s.median == 0.20
    assert s.spread == pytest.approx((0.30 - 0.10) / 0.20)
    assert Samples([0.5]).spread == 0.0


def test_variants_are_interleaved_rep_by_rep():
    assert interleaved(["a", "b"], 3) == [(0, "a"), (0, "b"), (1, "a"), (1, "b"), (2, "a"), (2, "b")]


def test_iteration_counts_depend_on_the_size_only_and_stay_bounded():
    assert iterations_for(4 << 10) == 100
    assert iterations_for(1 << 20) == 32
    assert iterations_for(64 << 20) == 2
    assert iterations_for(1 << 30) == 2


def test_a_wrong_result_is_refused_with_its_name_and_difference():
    assert check_close("ok", [3.0, 3.0], [3.0, 3.0], 0.0) == 0.0
    with pytest.raises(BenchmarkCheckError, match=r"allreduce hvd_mpi 4096 B.*max \|diff\| 1\.5"):
        check_close("allreduce hvd_mpi 4096 B", [1.5, 3.0], [3.0, 3.0], 1e-6)
    with pytest.raises(BenchmarkCheckError, match="2 values vs 3"):
        check_close("short", [3.0, 3.0], [3.0, 3.0, 3.0], 0.0)
    with pytest.raises(BenchmarkCheckError):
        check_close("nan", [math.nan], [3.0], 1.0)


def _results(hvdkit=0.050, horovod=0.0502, ddp=0.070, ckpt=1.05, extra=0.2, wire=0.5, fp16_faster_at=()):
    def sweep(c):
        rows = []
        for n in (4096, 64 << 20):
            rows += [
                {"bytes": n, "variant": f"hvd_{c}", "median_s": 1.0, "bandwidth_Bps": 1e9, "fraction_of_memcpy": 0.25},
                {
                    "bytes": n,
                    "variant": f"hvd_{c}_fp16",
                    "median_s": 0.5 if n in fp16_faster_at else 2.0,
                    "bandwidth_Bps": 5e8,
                    "fraction_of_memcpy": 0.1,
                },
                {"bytes": n, "variant": "memcpy", "median_s": 0.1, "bandwidth_Bps": 4e9, "fraction_of_memcpy": 1.0},
                {"bytes": n, "variant": "fp16_wire_ratio", "value": wire},
            ]
        return {"controller": c, "sweep": rows}

    return {
        "comm_mpi": sweep("mpi"),
        "comm_gloo": sweep("gloo"),
        "train_torch": {
            "variants": {"hvdkit": {"median_s": hvdkit}, "horovod": {"median_s": horovod}, "ddp": {"median_s": ddp}}
        },
        "checkpoint": {"hvdkit_vs_torch_save_fsync": ckpt},
        "startup": {"extra_s": extra},
    }


def test_goals_are_the_measured_ratios_against_their_targets():
    g = {x["name"]: x for x in report.goals(_results())}
    assert g["hvdkit / raw Horovod training throughput"]["value"] == pytest.approx(0.0502 / 0.050)
    assert g["hvdkit / raw Horovod training throughput"]["met"] is True
    assert g["hvdkit (MPI) / torch DDP (gloo) throughput"]["value"] == pytest.approx(1.4)
    assert g["Horovod MPI bus bandwidth / memcpy at 64 MB"]["value"] == 0.25
    assert g["fp16 bytes on the wire / fp32 (every size)"]["met"] is True


def test_goals_fail_when_a_ratio_misses_its_target():
    g = {x["name"]: x for x in report.goals(_results(hvdkit=0.052, ddp=0.040, ckpt=1.3, extra=0.5, wire=0.75))}
    assert g["hvdkit / raw Horovod training throughput"]["met"] is False  # 0.0502 / 0.052 = 0.965
    assert g["hvdkit per-step overhead vs raw Horovod"]["value"] == pytest.approx(0.052 / 0.0502 - 1)
    assert g["hvdkit (MPI) / torch DDP (gloo) throughput"]["met"] is False
    assert g["fp16 bytes on the wire / fp32 (every size)"]["met"] is False
    assert g["hvdkit checkpoint save / torch.save + fsync"]["met"] is False
    assert g["hvdkit run start-up - raw mpirun (s)"]["met"] is False


def test_compression_is_advised_only_at_bandwidth_bound_sizes_where_it_was_clearly_faster():
    assert report.compression_advice(_results(), "comm_mpi") == []
    assert report.compression_advice(_results(fp16_faster_at=(64 << 20,)), "comm_mpi") == [64 << 20]
    assert report.compression_advice(_results(fp16_faster_at=(4096,)), "comm_mpi") == []  # latency-bound


def test_goals_are_plain_data_as_written_to_results_json():
    goals = report.goals(_results())
    assert json.loads(json.dumps(goals)) == goals


def test_a_busy_machine_is_named_before_the_suite_measures_anything():
    assert busy_warning(0.4, 2) is None
    warning = busy_warning(3.2, 2)
    assert "load average 3.20 on 2 cores" in warning and "stray ranks" in warning.lower()

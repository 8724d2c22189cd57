"""hvdkit.diagnostics.timeline: a hand-written Horovod timeline with a closed-form summary, cut files, garbage."""

import json

import pytest

from hvdkit.core import ConfigError
from hvdkit.diagnostics import timeline

# The shape Horovod 0.28.1 writes (records as it prints them). Two tensors, times in microseconds:
#  a: negotiate 100..1100 (rank 1 ready at 100, rank 0 at 1100), allreduce 1200..1950 with
#     MEMCPY_IN 1210..1300, MPI_ALLREDUCE 1300..1800, MEMCPY_OUT 1800..1900; then a cached
#     negotiation 3000..3400 (no ticks) and allreduce 3400..4000 with MPI_ALLREDUCE 3450..3950.
#  b: negotiate 150..1200 (rank 0 at 150, rank 1 at 1200), fused with a's first allreduce.
SNIPPET = """[
{"name": "process_name", "ph": "M", "pid": 0, "args": {"start_time_since_epoch_in_micros":1000000}},
{"name": "process_sort_index", "ph": "M", "pid": 0, "args": {"sort_index": 0}},
{"name": "process_name", "ph": "M", "pid": 1, "args": {"name": "allreduce.a"}},
{"name": "process_sort_index", "ph": "M", "pid": 1, "args": {"sort_index": 1}},
{"ph": "B", "name": "NEGOTIATE_ALLREDUCE", "ts": 100, "pid": 1},{"ph": "X", "name": "1", "ts": 100, "pid": 1, "dur": 0},\
{"name": "process_name", "ph": "M", "pid": 2, "args": {"name": "allreduce.b"}},
{"name": "process_sort_index", "ph": "M", "pid": 2, "args": {"sort_index": 2}},
{"ph": "B", "name": "NEGOTIATE_ALLREDUCE", "ts": 150, "pid": 2},{"ph": "X", "name": "0", "ts": 150, "pid": 2, "dur": 0},\
{"ph": "X", "name": "0", "ts": 1100, "pid": 1, "dur": 0},{"ph": "E", "ts": 1100, "pid": 1},\
{"ph": "X", "name": "1", "ts": 1200, "pid": 2, "dur": 0},{"ph": "E", "ts": 1200, "pid": 2},\
{"ph": "B", "name": "ALLREDUCE", "ts": 1200, "pid": 1},{"ph": "B", "name": "ALLREDUCE", "ts": 1200, "pid": 2},\
{"ph": "B", "name": "MEMCPY_IN_FUSION_BUFFER", "ts": 1210, "pid": 1},\
{"ph": "B", "name": "MEMCPY_IN_FUSION_BUFFER", "ts": 1210, "pid": 2},{"ph": "E", "ts": 1300, "pid": 1},\
{"ph": "E", "ts": 1300, "pid": 2},{"ph": "B", "name": "MPI_ALLREDUCE", "ts": 1300, "pid": 1},\
{"ph": "B", "name": "MPI_ALLREDUCE", "ts": 1300, "pid": 2},{"ph": "E", "ts": 1800, "pid": 1},\
{"ph": "E", "ts": 1800, "pid": 2},{"ph": "B", "name": "MEMCPY_OUT_FUSION_BUFFER", "ts": 1800, "pid": 1},\
{"ph": "B", "name": "MEMCPY_OUT_FUSION_BUFFER", "ts": 1800, "pid": 2},{"ph": "E", "ts": 1900, "pid": 1},\
{"ph": "E", "ts": 1900, "pid": 2},{"ph": "E", "ts": 1950, "pid": 1, "args": {"dtype": "float32", "shape": "[256]"}},\
{"ph": "E", "ts": 1950, "pid": 2, "args": {"dtype": "float64", "shape": "[4, 8]"}},\
{"ph": "i", "name": "CYCLE_START", "ts": 2000, "s": "g"},\
{"ph": "B", "name": "NEGOTIATE_ALLREDUCE", "ts": 3000, "pid": 1},{"ph": "E", "ts": 3400, "pid": 1},\
{"ph": "B", "name": "ALLREDUCE", "ts": 3400, "pid": 1},{"ph": "B", "name": "MPI_ALLREDUCE", "ts": 3450, "pid": 1},\
{"ph": "E", "ts": 3950, "pid": 1},{"ph": "E", "ts": 4000, "pid": 1, "args": {"dtype": "float32", "shape": "[256]"}}]"""
LAST_RECORD = '{"ph": "E", "ts": 4000'


@pytest.fixture
def snippet(tmp_path):
    path = tmp_path / "tl.json"
    path.write_text(SNIPPET)
    return path


def by_name(summary):
    return {t.name: t for t in summary.tensors}


def test_each_tensors_operations_negotiations_and_size_are_counted(snippet):
    t = by_name(timeline.summarise(snippet))
    a, b = t["allreduce.a"], t["allreduce.b"]
    assert (a.ops, a.op_us, a.op_kinds, a.negotiations, a.negotiate_us) == (2, 750 + 600, {"ALLREDUCE": 2}, 2, 1400)
    assert (b.ops, b.op_us, b.negotiations, b.negotiate_us) == (1, 750, 1, 1050)
    assert (a.dtype, a.shape, a.bytes) == ("float32", [256], 1024)
    assert (b.dtype, b.shape, b.bytes) == ("float64", [4, 8], 256)


def test_activity_times_sum_exactly_to_each_tensors_operation_time(snippet):
    t = by_name(timeline.summarise(snippet))
    assert t["allreduce.a"].activities == {
        "MEMCPY_IN_FUSION_BUFFER": 90,
        "MPI_ALLREDUCE": 1000,
        "MEMCPY_OUT_FUSION_BUFFER": 100,
        "(other)": 160,
    }
    assert t["allreduce.b"].activities == {
        "MEMCPY_IN_FUSION_BUFFER": 90,
        "MPI_ALLREDUCE": 500,
        "MEMCPY_OUT_FUSION_BUFFER": 100,
        "(other)": 60,
    }
    for stats in t.values():
        assert sum(stats.activities.values()) == stats.op_us


def test_the_span_is_split_once_per_instant_so_overlapping_tensors_count_once(snippet):
    s = timeline.summarise(snippet)
    assert s.span_us == 4000 - 100
    # b's fused allreduce overlaps a's exactly: counted once. Negotiations 100..1200 and 3000..3400.
    assert s.breakdown == {"communication": 1000, "other_op_work": 350, "negotiation": 1500, "outside_horovod": 1050}
    assert sum(s.breakdown.values()) == s.span_us
    assert s.fractions["communication"] == pytest.approx(1000 / 3900)
    assert sum(s.fractions.values()) == pytest.approx(1.0, abs=1e-12)


def test_the_rank_ready_last_is_named_from_the_negotiation_ticks(snippet):
    rd = timeline.summarise(snippet).readiness
    assert (rd["negotiations"], rd["with_ticks"], rd["without_ticks"], rd["ranks"]) == (3, 2, 1, [0, 1])
    assert rd["last"] == {"0": 1, "1": 1} and rd["late_us"] == {"0": 1000, "1": 1050}
    assert rd["together"] == 0


def test_ticks_closer_than_one_cycle_count_as_ready_together(snippet):
    rd = timeline.summarise(snippet, same_cycle_us=2000).readiness
    assert rd["together"] == 2 and rd["last"] == {"0": 0, "1": 0}


def test_largest_tensors_cycles_and_start_time_are_reported(snippet):
    s = timeline.summarise(snippet)
    assert [t.name for t in s.largest(5)] == ["allreduce.a", "allreduce.b"]
    assert (s.cycles, s.start_epoch_us, s.truncated, s.unfinished) == (1, 1000000, False, 0)


def test_the_report_shows_the_breakdown_tensors_and_readiness(snippet):
    text = timeline.format_summary(timeline.summarise(snippet), top=1)
    assert "3 operations, span 3.90 ms, 1 cycles marked" in text
    assert "communication (MPI_/GLOO_/NCCL_ activities)" in text and "25.6%" in text
    assert "top 1 of 2 tensors" in text and "allreduce.a" in text.split("largest")[0]
    assert "allreduce.b" not in text.split("largest")[0]
    assert "rank 0 was ready last 1 time (the first-ready rank waited 1.00 ms in all)" in text


def test_a_file_cut_anywhere_is_read_up_to_its_last_complete_record(tmp_path):
    path, previous = tmp_path / "cut.json", 0
    full = len(timeline.parse(_write(path, SNIPPET))[0])
    for cut in range(1, len(SNIPPET)):
        records, truncated = timeline.parse(_write(path, SNIPPET[:cut]))
        assert truncated and previous <= len(records) <= full
        previous = len(records)
    assert previous == full  # only the closing ']' missing
    assert len(timeline.parse(_write(path, SNIPPET[:-2]))[0]) == full - 1  # the last record's '}' missing too


def test_a_cut_file_leaves_out_the_operation_that_never_ended(tmp_path):
    cut = SNIPPET[: SNIPPET.index(LAST_RECORD) + len(LAST_RECORD) - 2]
    s = timeline.summarise(_write(tmp_path / "cut.json", cut))
    a = by_name(s)["allreduce.a"]
    assert (s.truncated, s.unfinished, a.ops, a.op_us) == (True, 1, 1, 750)
    assert sum(s.breakdown.values()) == s.span_us == 3400 - 100  # to the end of the last finished span
    assert "file is cut off mid-record" in timeline.format_summary(s)


@pytest.mark.parametrize("tail", [",", ",\n", ""], ids=["trailing-comma", "comma-newline", "no-bracket"])
def test_an_unterminated_array_is_accepted(tmp_path, tail):
    text = SNIPPET[:-1] + tail
    records, truncated = timeline.parse(_write(tmp_path / "t.json", text))
    assert truncated and len(records) == len(json.loads(SNIPPET))


def test_garbage_between_records_is_an_error_naming_file_line_and_byte(tmp_path):
    at = SNIPPET.index('{"ph": "B", "name": "ALLREDUCE"')
    path = _write(tmp_path / "bad.json", SNIPPET[:at] + "garbage" + SNIPPET[at:])
    line = SNIPPET.count("\n", 0, at) + 1
    with pytest.raises(
        ConfigError,
        match=rf"timeline '.*bad\.json' is not a Horovod timeline at line {line}, "
        rf"column \d+ \(byte {at}\): Expecting value",
    ):
        timeline.parse(path)


@pytest.mark.parametrize(
    "content, message",
    [
        (b"hello", r"at line 1, column 1 \(byte 0\): expected '\['"),
        (b"[1, 2]", r"byte 1\): a record that is not a trace event"),
        (SNIPPET.encode() + b"\nx", r"text after the closing '\]'"),
        (b'[{"ph": "M"} {"ph": "M"}]', r"byte 13\): expected ',' or '\]' after a record"),
        (b'[{"ph": "B", "name": "x", "pid": 1}]', r"byte 1\): a 'B' record without a numeric 'ts'"),
        (b"[\xff\xfe", r"byte 1 is not UTF-8"),
        (b"  \n", r"is empty: rank 0 writes it once the first collective runs"),
    ],
    ids=["not-json", "not-events", "trailing-text", "missing-comma", "no-time", "binary", "empty"],
)
def test_files_that_are_not_timelines_are_clear_errors(tmp_path, content, message):
    path = tmp_path / "x.json"
    path.write_bytes(content)
    with pytest.raises(ConfigError, match=message):
        timeline.parse(path)


def test_a_missing_file_names_the_flag_that_writes_it(tmp_path):
    with pytest.raises(
        ConfigError, match=r"'.*nope\.json' does not exist; pass the FILE given to hvdkit run --timeline"
    ):
        timeline.summarise(tmp_path / "nope.json")


def test_cli_prints_the_report_and_writes_json_and_png(snippet, tmp_path, capsys):
    from hvdkit.cli import main

    out_json, out_png = tmp_path / "s.json", tmp_path / "p.png"
    assert main(["timeline", str(snippet), "--json", str(out_json), "--plot", str(out_png), "--top", "2"]) == 0
    assert "allreduce.b" in capsys.readouterr().out
    data = json.loads(out_json.read_text())
    assert data["breakdown"]["negotiation"] == 1500 and data["largest"] == ["allreduce.a", "allreduce.b"]
    assert [t["name"] for t in data["tensors"]] == ["allreduce.a", "allreduce.b"]
    assert out_png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_cli_rejects_a_top_below_one(snippet, capsys):
    from hvdkit.cli import main

    assert main(["timeline", str(snippet), "--top", "0"]) == 2
    assert "--top must be an integer >= 1 (got 0)" in capsys.readouterr().err


def _write(path, text):
    path.write_text(text)
    return path

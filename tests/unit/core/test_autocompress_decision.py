"""compression="auto": the pure decision, the precedence of argument > HVDKIT_COMPRESSION > measurement."""

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hvdkit.core.autocompress import DEFAULT_MARGIN, Decision, decide, resolve_compression, wanted_compression
from hvdkit.core.errors import ConfigError
from hvdkit.core.options import check_compression

seconds = st.floats(min_value=1e-6, max_value=1e3, allow_nan=False, allow_infinity=False)


def test_fp16_is_chosen_only_when_it_is_faster_by_more_than_the_margin():
    assert decide(1.0, 0.5) == "fp16"
    assert decide(1.0, 0.89) == "fp16"
    assert decide(1.0, 0.91) == "none"  # 9 % faster: within the margin, exact fp32 stays
    assert decide(1.0, 1.0) == "none"
    assert decide(1.0, 2.0) == "none"
    assert decide(1.0, 0.95, margin=0.0) == "fp16"


@given(seconds, seconds, st.floats(min_value=1e-3, max_value=1e3))
def test_the_decision_does_not_depend_on_the_unit_of_time(fp32, fp16, scale):
    if abs(fp16 - fp32 * (1 - DEFAULT_MARGIN)) <= 1e-9 * fp32:
        return  # on the boundary rounding may go either way
    assert decide(fp32, fp16) == decide(fp32 * scale, fp16 * scale)


@given(seconds, seconds, st.floats(min_value=1e-3, max_value=1.0))
def test_a_faster_fp16_never_turns_a_choice_of_fp16_into_none(fp32, fp16, shrink):
    if decide(fp32, fp16) == "fp16":
        assert decide(fp32, fp16 * shrink) == "fp16"


@given(seconds, seconds, st.floats(min_value=0.0, max_value=0.9), st.floats(min_value=0.0, max_value=0.9))
def test_a_wider_margin_never_chooses_fp16_where_a_narrower_one_keeps_none(fp32, fp16, m1, m2):
    narrow, wide = sorted((m1, m2))
    if decide(fp32, fp16, narrow) == "none":
        assert decide(fp32, fp16, wide) == "none"


@pytest.mark.parametrize("bad", [0.0, -1.0, math.nan, math.inf, "1", True, None])
def test_bad_timings_are_refused_with_the_value_named(bad):
    with pytest.raises(ConfigError, match="fp16_s must be a finite number of seconds"):
        decide(1.0, bad)


def test_bad_margin_is_refused():
    with pytest.raises(ConfigError, match=r"margin must be a number in \[0, 1\) \(got 1.5\)"):
        decide(1.0, 0.5, margin=1.5)


@pytest.mark.parametrize("bad", ["int8", "FP16", "", 16])
def test_bad_compression_names_the_value_and_every_choice_including_auto(bad):
    with pytest.raises(ConfigError) as e:
        check_compression(bad, allow_auto=True)
    msg = str(e.value)
    assert f"(got {bad!r})" in msg and "'none', 'fp16', 'auto'" in msg
    assert isinstance(e.value, ValueError)


def test_auto_is_refused_where_it_is_not_supported():
    with pytest.raises(ConfigError, match="'none', 'fp16' \\(got 'auto'\\)"):
        check_compression("auto")


def measuring(result):
    calls = []

    def measure():
        calls.append(1)
        return result

    return measure, calls


def test_an_explicit_choice_wins_over_the_variable_and_measures_nothing():
    measure, calls = measuring((1.0, 0.1, 4, 1))
    logged = []
    choice, decision = resolve_compression("none", measure, 2, logged.append, {"HVDKIT_COMPRESSION": "fp16"})
    assert (choice, decision.source, calls, logged) == ("none", "explicit", [], [])


def test_the_variable_overrides_auto_without_measuring_and_is_logged():
    measure, calls = measuring((1.0, 0.1, 4, 1))
    logged = []
    choice, decision = resolve_compression("auto", measure, 2, logged.append, {"HVDKIT_COMPRESSION": "none"})
    assert (choice, calls) == ("none", [])
    assert logged == ["compression='auto' -> 'none' (env HVDKIT_COMPRESSION)"]


def test_auto_measures_once_and_logs_both_times_and_the_sizes():
    measure, calls = measuring((0.004, 0.002, 16_000_000, 10))
    logged = []
    choice, decision = resolve_compression("auto", measure, 2, logged.append, {})
    assert (choice, calls, decision.speedup) == ("fp16", [1], 2.0)
    assert (
        "10 gradients, 16.00 MB fp32" in logged[0]
        and "4.000 ms in fp32" in logged[0]
        and "2.000 ms in fp16" in logged[0]
    )
    assert decision.as_dict()["choice"] == "fp16"


def test_rank0s_variable_decides_for_every_rank():
    measure, calls = measuring((0.004, 0.002, 16, 1))
    # this rank has HVDKIT_COMPRESSION=none but rank 0 has none set: all measure, none skips
    choice, decision = resolve_compression(
        "auto", measure, 2, None, {"HVDKIT_COMPRESSION": "none"}, agree=lambda w: "auto"
    )
    assert (choice, decision.source, calls) == ("fp16", "measured", [1])
    choice, _ = resolve_compression("auto", measure, 2, None, {}, agree=lambda w: "none")
    assert choice == "none" and calls == [1]


def test_auto_on_one_rank_measures_nothing_and_keeps_fp32():
    measure, calls = measuring((1.0, 0.1, 4, 1))
    assert resolve_compression("auto", measure, 1, None, {})[0] == "none" and calls == []


def test_a_bad_variable_names_the_variable_and_its_value():
    with pytest.raises(ConfigError, match=r"HVDKIT_COMPRESSION must be one of none, fp16, auto \(got 'int8'\)"):
        wanted_compression("auto", {"HVDKIT_COMPRESSION": "int8"})


def test_the_variable_set_to_auto_leaves_the_choice_to_the_measurement():
    assert wanted_compression("auto", {"HVDKIT_COMPRESSION": "auto"}) == "auto"
    assert wanted_compression(None, {"HVDKIT_COMPRESSION": "fp16"}) == "none"  # only "auto" reads it


def test_a_decision_with_no_measurement_has_no_speedup():
    assert math.isnan(Decision("none", math.nan, math.nan, 0, 0, source="single rank").speedup)


@given(st.lists(st.floats(min_value=0, max_value=1e3, allow_nan=False), min_size=1, max_size=30))
def test_median_is_the_statistics_median(values):
    import statistics

    from hvdkit.core.autocompress import median

    assert median(values) == statistics.median(values)


def test_fp32_bytes_counts_four_bytes_per_element_of_every_shape():
    from hvdkit.core.autocompress import fp32_bytes

    assert fp32_bytes([(2, 3), (4,), ()]) == 4 * (6 + 4 + 1)
    assert fp32_bytes([]) == 0

"""hvdkit tune's search space: the YAML it accepts becomes exact Optuna distributions and flags; whatever
else it gets is a SpaceError naming the key, the bad value and the fix (examples and Hypothesis)."""

import math

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from hvdkit.core.errors import ConfigError
from hvdkit.tune.space import Param, SpaceError, load_space, parse_space

optuna = pytest.importorskip("optuna")

NAMES = st.from_regex(r"[A-Za-z][A-Za-z0-9_-]{0,12}", fullmatch=True)
FINITE = st.floats(allow_nan=False, allow_infinity=False, min_value=-1e6, max_value=1e6)


def test_the_issue_s_example_with_1e_minus_4_read_as_text_by_yaml_becomes_a_log_float(tmp_path):
    path = tmp_path / "space.yaml"
    path.write_text(
        "lr: {type: float, low: 1e-4, high: 1e-1, log: true}\n"
        "layers: {type: int, low: 1, high: 4}\n"
        "opt: {type: categorical, choices: [sgd, adam]}\n"
    )
    assert yaml.safe_load(path.read_text())["lr"]["low"] == "1e-4"  # why the parser reads numeric text
    space = load_space(str(path))
    assert space.params == (
        Param("lr", "float", low=1e-4, high=0.1, log=True),
        Param("layers", "int", low=1, high=4),
        Param("opt", "categorical", choices=("sgd", "adam")),
    )
    assert space.flags({"lr": 0.0123, "layers": 3, "opt": "adam"}) == [
        "--lr",
        "0.0123",
        "--layers",
        "3",
        "--opt",
        "adam",
    ]


@pytest.mark.parametrize(
    ("data", "words"),
    [
        ({}, ["mapping of flag names"]),
        ([1, 2], ["mapping of flag names"]),
        ({"lr": 0.1}, ["'lr'", "mapping with 'type'"]),
        ({"lr": {"type": "uniform", "low": 0, "high": 1}}, ["'lr'", "'type' must be one of float, int, categorical"]),
        ({"lr": {"type": "float", "low": 0.1}}, ["'lr'", "needs 'high'"]),
        ({"lr": {"type": "float", "low": 0, "high": 1, "lg": True}}, ["'lr'", "unknown field(s) 'lg'", "allowed"]),
        ({"lr": {"type": "float", "low": "abc", "high": 1}}, ["'lr'", "'low' must be a finite number", "'abc'"]),
        ({"lr": {"type": "float", "low": 1, "high": 0.5}}, ["'lr'", "below 'high'", "swap"]),
        ({"lr": {"type": "float", "low": 0, "high": 1, "log": True}}, ["'lr'", "log scale needs 'low' > 0"]),
        ({"lr": {"type": "float", "low": 1, "high": 2, "log": "yes"}}, ["'lr'", "'log' must be true or false"]),
        ({"n": {"type": "int", "low": 1.5, "high": 4}}, ["'n'", "must be an integer", "1.5", "type: float"]),
        ({"n": {"type": "int", "low": 1, "high": 8, "step": 2, "log": True}}, ["'n'", "'step' cannot go with log"]),
        ({"n": {"type": "int", "low": 1, "high": 4, "step": 8}}, ["'n'", "wider than high - low"]),
        ({"n": {"type": "int", "low": 16, "high": 120, "step": 16}}, ["'n'", "multiple of 'step'", "high: 112"]),
        ({"x": {"type": "float", "low": 0, "high": 1, "step": 0.3}}, ["'x'", "multiple of 'step'", "high: 0.9"]),
        ({"o": {"type": "categorical", "choices": []}}, ["'o'", "non-empty list"]),
        ({"o": {"type": "categorical", "choices": "sgd"}}, ["'o'", "non-empty list"]),
        ({"o": {"type": "categorical", "choices": ["a", "a"]}}, ["'o'", "'a' is listed twice"]),
        ({"o": {"type": "categorical", "choices": [None]}}, ["'o'", "choice None"]),
        ({"o": {"type": "categorical", "choices": [[1]]}}, ["'o'", "choice [1]"]),
        ({"--lr": {"type": "float", "low": 0, "high": 1}}, ["'--lr'", "must be a flag name"]),
        ({1: {"type": "float", "low": 0, "high": 1}}, ["key 1", "must be a flag name"]),
    ],
)
def test_a_bad_space_is_a_space_error_naming_the_key_and_the_fix(data, words):
    with pytest.raises(SpaceError) as e:
        parse_space(data, source="s.yaml")
    assert isinstance(e.value, ConfigError) and isinstance(e.value, ValueError)
    for word in words:
        assert word in str(e.value)


def test_an_unreadable_or_invalid_yaml_file_is_a_space_error_naming_it(tmp_path):
    with pytest.raises(SpaceError, match="cannot be read"):
        load_space(str(tmp_path / "missing.yaml"))
    bad = tmp_path / "bad.yaml"
    bad.write_text("lr: {type: float, low: [\n")
    with pytest.raises(SpaceError, match="is not valid YAML"):
        load_space(str(bad))


@st.composite
def valid_params(draw):
    kind = draw(st.sampled_from(["float", "int", "categorical"]))
    if kind == "categorical":
        choices = draw(
            st.lists(
                st.one_of(st.text(min_size=1).filter(lambda s: "\0" not in s), st.integers()),
                min_size=1,
                max_size=5,
                unique_by=lambda c: (type(c), c),
            )
        )
        return {"type": kind, "choices": choices}
    log = draw(st.booleans())
    if kind == "int":
        low = draw(st.integers(1 if log else -1000, 1000))
        high = draw(st.integers(low + 1, low + 1000))
        spec = {"type": kind, "low": low, "high": high, "log": log}
        if not log and draw(st.booleans()):
            spec["step"] = step = draw(st.integers(1, high - low))
            spec["high"] = low + step * ((high - low) // step)  # a range the step divides
        return spec
    low = draw(st.floats(1e-6, 1e3) if log else FINITE)
    high = low + draw(st.floats(1e-3, 1e3))
    return {"type": kind, "low": low, "high": high, "log": log}


@given(st.dictionaries(NAMES, valid_params(), min_size=1, max_size=5))
@settings(max_examples=150, deadline=None)
def test_every_valid_space_parses_to_values_optuna_samples_inside_it_and_flags_that_read_back(data):
    space = parse_space(data)
    assert space.names() == list(data)
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    trial = study.ask()
    values = space.suggest(trial)
    flags = space.flags(values)
    for param, (flag, text) in zip(space.params, zip(flags[::2], flags[1::2], strict=True), strict=True):
        spec, value = data[param.name], values[param.name]
        assert flag == f"--{param.name}"
        if param.kind == "categorical":
            assert value in spec["choices"] and text == str(value)
        else:
            assert spec["low"] <= value <= spec["high"]
            back = float(text) if param.kind == "float" else int(text)
            assert back == value and (param.kind == "float") == isinstance(value, float)


@given(NAMES, st.one_of(st.none(), st.integers(), st.text(), st.lists(st.integers()), FINITE))
@settings(max_examples=100, deadline=None)
def test_anything_but_a_mapping_with_a_type_is_rejected_naming_its_key(name, spec):
    with pytest.raises(SpaceError) as e:
        parse_space({name: spec})
    assert repr(name) in str(e.value)


@given(st.sampled_from([math.nan, math.inf, -math.inf, "nan", "inf"]), NAMES)
def test_a_bound_that_is_not_finite_is_rejected(bad, name):
    with pytest.raises(SpaceError, match="finite number"):
        parse_space({name: {"type": "float", "low": bad, "high": 1.0}})

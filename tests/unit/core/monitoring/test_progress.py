import io

import pytest

from hvdkit.core import ConfigError, Progress


class FakeClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def run(progress, clock, steps, seconds_per_step):
    for _ in range(steps):
        clock.now += seconds_per_step
        progress.update(1, samples=32)


def test_pipe_output_prints_a_line_per_interval_with_rate_and_eta(monkeypatch):
    monkeypatch.setenv("HVDKIT_PROGRESS", "1")
    clock, out = FakeClock(), io.StringIO()
    p = Progress(100, desc="epoch 1/3", stream=out, interval=10.0, clock=clock)
    run(p, clock, 100, 0.5)  # 50 s of work: a line every 10 s
    lines = out.getvalue().splitlines()
    assert len(lines) == 5
    assert lines[0].startswith("epoch 1/3 [") and "20/100  20%" in lines[0]
    assert "64 samples/s" in lines[0] and "eta 00:40" in lines[0]


def test_short_work_in_a_pipe_prints_nothing(monkeypatch):
    monkeypatch.setenv("HVDKIT_PROGRESS", "1")
    clock, out = FakeClock(), io.StringIO()
    run(Progress(20, stream=out, clock=clock), clock, 20, 0.01)
    assert out.getvalue() == ""


def test_off_on_ranks_other_than_zero_and_when_asked(monkeypatch):
    monkeypatch.setenv("HVDKIT_PROGRESS", "1")
    assert not Progress(10, show=False, stream=io.StringIO()).enabled
    monkeypatch.setenv("HVDKIT_PROGRESS", "off")
    assert not Progress(10, show=True, stream=io.StringIO()).enabled


def test_default_is_off_when_the_stream_is_not_a_terminal(monkeypatch):
    monkeypatch.delenv("HVDKIT_PROGRESS", raising=False)
    assert not Progress(10, stream=io.StringIO()).enabled


def test_a_bad_progress_setting_names_the_variable(monkeypatch):
    monkeypatch.setenv("HVDKIT_PROGRESS", "maybe")
    with pytest.raises(ConfigError, match="HVDKIT_PROGRESS.*'maybe'"):
        Progress(10, stream=io.StringIO())


def test_torch_progress_over_an_iterator_without_a_length_asks_for_total():
    hk = pytest.importorskip("hvdkit.torch")
    with pytest.raises(ConfigError, match=r"generator has no len\(\); pass total=N"):
        hk.progress(x for x in range(3))

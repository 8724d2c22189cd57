"""Elastic training by restart, the pure parts: discovery output, settings, world choice, the loop
with a fake discovery, clock and launch, the summary, and ``hvdkit run --dry-run``."""

import os
import re
import subprocess
import threading
import time

import pytest
from fake_clock import FakeClock
from hypothesis import given
from hypothesis import strategies as st

from hvdkit.cli import main
from hvdkit.core import env
from hvdkit.core.comm import LocalCommunicator
from hvdkit.core.errors import ConfigError, LaunchError
from hvdkit.core.preemption import PreemptionGuard
from hvdkit.launcher import job, remote, slurm_nodes
from hvdkit.launcher.attempts import Attempt, ElasticGaveUp, History, StopRequest
from hvdkit.launcher.elastic.discovery import DiscoveryError, FixedDiscovery, ScriptDiscovery, parse_discovery_output
from hvdkit.launcher.elastic.loop import HostView, run_elastic, wait_for_world, watch
from hvdkit.launcher.elastic.rules import ElasticSettings, can_grow, choose_world, lost_hosts, settings_from
from hvdkit.launcher.execute import JobResult, RankProgress, RankReports
from hvdkit.launcher.hosts import Host

A, B, C = Host("a", 1), Host("b", 1), Host("c", 2)


def settings(n=2, lo=1, hi=2, interval=1.0, timeout=10.0):
    return ElasticSettings(n, lo, hi, interval, timeout, "the test's discovery")


# --- discovery output -------------------------------------------------------------------------


def test_discovery_output_is_host_slots_lines_with_comments_and_default_one_slot():
    text = "# hosts\nnode1:4\n\n  node2  \nnode-3.x:2  # rack 2\n"
    assert parse_discovery_output(text) == (Host("node1", 4), Host("node2", 1), Host("node-3.x", 2))
    assert parse_discovery_output("") == ()


@pytest.mark.parametrize(
    "text, bad", [("node1:0\n", "node1:0"), ("node1:x\n", "node1:x"), ("a b\n", "a b"), (":3\n", ":3")]
)
def test_a_bad_discovery_line_is_an_error_naming_the_line(text, bad):
    with pytest.raises(DiscoveryError, match=rf"line 1: bad entry '{bad}'; expected one 'host:slots' line"):
        parse_discovery_output(text)


def test_a_host_listed_twice_by_discovery_is_an_error():
    with pytest.raises(DiscoveryError, match="line 2: host 'a' is listed twice"):
        parse_discovery_output("a:1\na:2\n")


_names = st.from_regex(r"[a-z][a-z0-9.-]{0,12}", fullmatch=True)


@given(
    st.dictionaries(_names, st.integers(1, 64), max_size=8),
    st.lists(st.sampled_from(["", "# note", "   "]), max_size=3),
)
def test_discovery_output_round_trips_any_host_list(hosts, noise):
    lines = [f"{name}:{slots}" if slots > 1 or len(name) % 2 else name for name, slots in hosts.items()]
    text = "\n".join(noise + lines + noise)
    assert parse_discovery_output(text) == tuple(Host(n, s) for n, s in hosts.items())


@given(st.text(max_size=60))
def test_any_discovery_output_is_hosts_or_a_discovery_error(text):
    try:
        found = parse_discovery_output(text)
    except DiscoveryError:
        return
    assert all(isinstance(h, Host) and h.slots >= 1 for h in found)


def test_a_discovery_script_is_run_and_its_failure_named(tmp_path):
    good, bad = tmp_path / "good.sh", tmp_path / "bad.sh"
    good.write_text("#!/bin/sh\necho a:2\necho b\n")
    bad.write_text("#!/bin/sh\necho 'no scheduler' >&2\nexit 3\n")
    for script in (good, bad):
        script.chmod(0o755)
    assert ScriptDiscovery(str(good)).hosts() == (Host("a", 2), Host("b", 1))
    with pytest.raises(DiscoveryError, match=r"exited with code 3: no scheduler"):
        ScriptDiscovery(str(bad)).hosts()
    bad.chmod(0o644)
    with pytest.raises(ConfigError, match="is not executable; chmod \\+x it"):
        ScriptDiscovery(str(bad)).check()


# --- settings and the choice of a world ---------------------------------------------------------


def _settings(n, lo, hi, script="/d.sh", hosts=()):
    return settings_from(n, lo, hi, script=script, hosts=hosts, origin="-H a:1,b:1", interval=5.0, timeout=60.0)


def test_a_job_without_elastic_flags_is_not_elastic_and_bounds_default_to_np():
    assert _settings(2, None, None, script=None) is None
    s = _settings(2, 1, None)
    assert (s.num_proc, s.min_np, s.max_np) == (2, 1, 2)


@pytest.mark.parametrize(
    "n, lo, hi, script, hosts, message",
    [
        (2, 3, 4, "/d.sh", (), "--min-np 3 is more than -np 2"),
        (3, 1, 2, "/d.sh", (), "-np 3 is more than --max-np 2"),
        (2, 0, 2, "/d.sh", (), "--min-np must be >= 1"),
        (2, 1, 4, None, (A, B), "--max-np 4 needs 4 slots but -H a:1,b:1 gives 2 .* no host can join"),
        (2, 1, 2, None, (), "--min-np/--max-np need hosts that can come and go"),
    ],
)
def test_elastic_flags_that_cannot_work_are_errors_before_anything_starts(n, lo, hi, script, hosts, message):
    with pytest.raises(ConfigError, match=message):
        _settings(n, lo, hi, script, hosts)


def test_the_first_world_takes_np_ranks_later_ones_up_to_max_np_keeping_the_old_hosts_first():
    s = settings(n=2, lo=1, hi=4)
    assert choose_world((C, A, B), s, first=True) == (Host("c", 2),)
    assert choose_world((C, A, B), s, previous=(A, B)) == (A, B, Host("c", 2))
    assert choose_world((A,), s, previous=(A, B)) == (A,)
    assert choose_world((), s) is None
    assert choose_world((A,), settings(n=2, lo=2, hi=2)) is None


def test_lost_hosts_and_growth_follow_what_discovery_lists():
    assert lost_hosts((A, B), (A,)) == ["b"]
    assert lost_hosts((A, Host("c", 2)), (A, Host("c", 1))) == ["c"]
    assert lost_hosts((A,), (A, B)) == []
    assert can_grow((A,), (A, B), settings(hi=2)) and not can_grow((A, B), (A, B, C), settings(hi=2))
    assert not can_grow((A,), (A,), settings(hi=2))


# --- the loop with a fake discovery, clock and launch -------------------------------------------


class FakeDiscovery:
    """Lists ``answers`` in turn (the last one forever); a string is a failing discovery."""

    def __init__(self, *answers):
        self.answers = list(answers)

    def hosts(self):
        answer = self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]
        if isinstance(answer, str):
            raise DiscoveryError(answer)
        return answer


def view_of(*answers, unreachable=None):
    unreachable = unreachable or {}
    return HostView(
        FakeDiscovery(*answers),
        check=lambda hosts, _t: {h.name: unreachable[h.name] for h in hosts if h.name in unreachable},
    )


def test_waiting_below_min_np_returns_once_hosts_come():
    clock, said = FakeClock(), []
    world, _ = wait_for_world(view_of((), (), (A, B)), settings(lo=2), clock=clock, sleep=clock.sleep, log=said.append)
    assert world == (A, B) and clock.now == 2.0 and len(said) == 1 and "fewer than --min-np 2" in said[0]


def test_a_failing_discovery_is_said_when_it_happens_once_per_change_and_in_the_final_error():
    """Before: nothing for the whole --elastic-timeout, then "only 0 slot(s) available" and advice
    to bring hosts back; only --dry-run showed the script's error."""
    clock, said = FakeClock(), []
    view = view_of(
        "exited with code 2: no such namespace", "exited with code 2: no such namespace", "cannot parse 'x:y'"
    )
    with pytest.raises(LaunchError) as caught:
        wait_for_world(view, settings(lo=2, timeout=10), first=True, clock=clock, sleep=clock.sleep, log=said.append)
    failures = [line for line in said if line.startswith("host discovery failed")]
    assert failures == [
        "host discovery failed: exited with code 2: no such namespace",
        "host discovery failed: cannot parse 'x:y'",
    ]
    assert said.index(failures[0]) == 0  # at the first poll, not after the timeout
    assert str(caught.value).endswith(
        "; host discovery failed: cannot parse 'x:y'; hosts from the test's discovery. The newest "
        "checkpoint is kept: bring the hosts back and run the job again"
    )


def test_a_hanging_discovery_script_is_ended_with_what_it_started(tmp_path):
    """A poll that times out ends the script's whole process group: before, each poll left an orphan."""
    pid_file = tmp_path / "child.pid"
    script = tmp_path / "discover.sh"
    script.write_text(f"#!/bin/sh\nsleep 300 &\necho $! > {pid_file}\nwait\n")
    script.chmod(0o755)
    with pytest.raises(DiscoveryError, match=r"gave no answer within 1 s"):
        ScriptDiscovery(str(script), timeout=1.0).hosts()
    child = int(pid_file.read_text())
    deadline = time.monotonic() + 10
    while os.path.exists(f"/proc/{child}") and _state(child) != "Z" and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not os.path.exists(f"/proc/{child}") or _state(child) == "Z", (
        f"the script's sleep (pid {child}) outlived the poll"
    )


def _state(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "gone"


def test_below_min_np_past_the_timeout_fails_naming_the_missing_host_and_why():
    clock = FakeClock()
    view = view_of((A, B), unreachable={"b": "ssh: connect to host b port 22: No route to host"})
    with pytest.raises(LaunchError) as e:
        wait_for_world(
            view, settings(lo=2, timeout=10), previous=(A, B), clock=clock, sleep=clock.sleep, log=lambda _: None
        )
    text = str(e.value)
    assert "only 1 slot(s) available (a:1), fewer than --min-np 2, for 10 s" in text
    assert "missing: b:1: ssh: connect to host b port 22: No route to host" in text
    assert "The newest checkpoint is kept" in text


class Ended:
    """An ``ended`` event that is set after ``polls`` waits."""

    def __init__(self, polls):
        self.polls = polls

    def wait(self, _timeout):
        self.polls -= 1
        return self.polls < 0


class Ranks:
    """What a running attempt's ranks have reported so far; the watcher reads it through ``progress``."""

    def __init__(self, training=False, started=None, last_step=None, resumed=None):
        self.training, self.started, self.last_step, self.resumed = training, started, last_step, resumed

    def progress(self):
        return RankProgress(self.started, self.last_step, self.training, self.resumed)


def attempts(fn):
    """A ``launch`` for run_elastic from ``fn(world, attempt, changes, stop) -> JobResult``, called when the attempt runs."""

    class FakeExecution:
        def __init__(self, *args):
            self.args = args

        def progress(self):
            return RankProgress()

        def run(self, stop):
            return fn(*self.args, stop)

    def launch(world, size, attempt, changes):
        assert size == sum(h.slots for h in world)  # an elastic attempt runs on every slot of its world
        return FakeExecution(world, attempt, changes)

    return launch


def _watch(view, running, polls=5, step=3, started=None):
    stop, record, said = StopRequest(), type("R", (), {"noticed": None})(), []
    ranks = Ranks(training=step is not None, started=started)
    watch(
        view,
        running,
        settings(hi=2),
        stop,
        Ended(polls),
        record,
        clock=lambda: 7.0,
        log=said.append,
        progress=ranks.progress,
    )
    return stop, record, said


def test_the_watcher_asks_to_grow_when_a_reachable_host_comes_and_not_before():
    stop, record, said = _watch(view_of((A,), "script failed", (A, B)), (A,))
    assert stop.is_set() and stop.reason == "b:1 came" and record.noticed == 7.0 and "can join" in said[2]
    assert said[:2] == [
        "host discovery failed: script failed; the ranks keep running on their hosts",
        "host discovery works again",
    ]
    stop, _, _ = _watch(view_of((A, B), unreachable={"b": "no route"}), (A,))
    assert not stop.is_set()


def test_the_watcher_asks_at_the_first_poll_the_ranks_train_with_the_ssh_check_made_while_they_started():
    clock, checks = FakeClock(), []
    view = HostView(FakeDiscovery((A, B)), check=lambda hosts, _t: checks.append(clock.now) or {})
    stop, record, ranks = StopRequest(), type("R", (), {"noticed": None})(), Ranks()

    class Ended:  # the ranks report their guard after the third poll
        polls = 0

        def wait(self, timeout):
            clock.advance(timeout)
            self.polls += 1
            ranks.training = self.polls > 3
            return self.polls > 10

    watch(
        view,
        (A,),
        settings(interval=0.5),
        stop,
        Ended(),
        record,
        clock=clock,
        log=lambda _: None,
        progress=ranks.progress,
    )
    assert stop.reason == "b:1 came" and record.noticed == 2.0
    assert checks == [0.5]  # one ssh check while starting (fresh for 2 s), none when the gate opened


def test_the_watcher_waits_until_the_ranks_train_before_asking_them_to_stop():
    stop, _, _ = _watch(view_of((A, B)), (A,), step=None, started=None)
    assert not stop.is_set()  # still loading: a stop now would kill them before any checkpoint
    stop, _, _ = _watch(view_of((A, B)), (A,), step=None, started=7.0 - 59.0)
    assert not stop.is_set()
    stop, _, _ = _watch(view_of((A, B)), (A,), step=None, started=7.0 - 60.0)  # no guard: 60 s after the start
    assert stop.reason == "b:1 came"


def test_the_watcher_stops_the_attempt_when_a_running_host_leaves_discovery():
    stop, _, said = _watch(view_of((A, B), (A,)), (A, B))
    assert stop.reason == "b no longer listed by discovery" and "b left" in said[0]


class TickingEnded:
    """An ``ended`` event that advances ``clock`` by each wait and is set after ``polls`` waits."""

    def __init__(self, clock, polls):
        self.clock, self.polls = clock, polls

    def wait(self, timeout):
        self.clock.advance(timeout)
        self.polls -= 1
        return self.polls < 0


def test_a_running_host_that_stops_answering_twice_ends_the_attempt_at_once():
    clock, said = FakeClock(), []
    answers = iter([{}, {"b": "no route"}, {"b": "no route"}])
    view = HostView(FakeDiscovery((A, B)), check=lambda hosts, _t: next(answers) if hosts == [A, B] else {})
    stop, record = StopRequest(), type("R", (), {"noticed": None})()
    watch(view, (A, B), settings(interval=5.0), stop, TickingEnded(clock, 20), record, clock=clock, log=said.append)
    assert stop.hard and stop.reason == "b stopped answering over ssh"
    assert record.noticed == 30.0  # checks at 10 s (fine), 20 s and 30 s (no route twice)
    assert "b (no route) stopped answering" in said[0]


class SteppingEnded(TickingEnded):
    """A TickingEnded during each wait of which rank 0 reports a new step (when ``stepping``)."""

    def __init__(self, clock, polls, ranks, stepping=True):
        super().__init__(clock, polls)
        self.ranks, self.stepping = ranks, stepping
        ranks.last_step = 100

    def wait(self, timeout):
        self.ranks.last_step += self.stepping
        return super().wait(timeout)


@pytest.mark.parametrize("stepping", [True, False])
def test_failed_ssh_checks_end_the_attempt_only_while_the_ranks_report_no_new_step(stepping):
    """A DNS hiccup or sshd throttling fails ssh while every rank trains (the steps since the last
    checkpoint were lost); a host that fails the checks while the job is silent ends it, as before."""
    clock, said = FakeClock(), []
    view = HostView(FakeDiscovery((A, B)), check=lambda hosts, _t: {"b": "timeout"} if hosts == [A, B] else {})
    stop, ranks = StopRequest(), Ranks(training=True)
    watch(
        view,
        (A, B),
        settings(interval=5.0),
        stop,
        SteppingEnded(clock, 9, ranks, stepping),
        type("R", (), {"noticed": None})(),
        clock=clock,
        log=said.append,
        progress=ranks.progress,
    )
    assert stop.is_set() is not stepping
    kept = [line for line in said if "failed two ssh checks, but the ranks keep training" in line]
    assert kept == (
        ["b (timeout) failed two ssh checks, but the ranks keep training (step 104): not ending the attempt"]
        if stepping
        else []
    )


def test_one_failed_liveness_check_is_not_enough():
    clock = FakeClock()
    answers = iter([{"b": "timeout"}, {}, {"b": "timeout"}, {}])
    view = HostView(FakeDiscovery((A, B)), check=lambda hosts, _t: next(answers, {}) if hosts == [A, B] else {})
    stop = StopRequest()
    watch(
        view,
        (A, B),
        settings(interval=5.0),
        stop,
        TickingEnded(clock, 9),
        type("R", (), {"noticed": None})(),
        clock=clock,
        log=lambda _: None,
    )
    assert not stop.is_set()


def _result(code=0, stop=None, started=None, noticed=None, resumed=None, last=None, message="", guarded=True):
    """An attempt's JobResult; ranks asked to stop (``stop``) that end 0 said they stop because asked."""
    return JobResult(
        code,
        message=message,
        stop_reason=stop,
        ranks_started_at=started,
        failure_noticed_at=noticed,
        resumed_step=resumed,
        last_step=last,
        guarded=guarded,
        stopped_as_asked=bool(stop) and code == 0,
    )


def test_a_shrink_then_a_grow_relaunch_at_the_sizes_discovery_allows_and_are_summarised():
    clock = FakeClock()
    # attempt 1 on a,b fails (b died); b unreachable: attempt 2 on a; b back: grow; attempt 3 finishes
    reach = {}
    view = HostView(
        FakeDiscovery((A, B)), check=lambda hosts, _t: {h.name: reach[h.name] for h in hosts if h.name in reach}
    )
    script = [
        lambda: (
            reach.update(b="no route"),
            _result(137, started=1.0, noticed=10.0, resumed=-1, last=30, message="rank 1 killed"),
        )[1],
        lambda: (reach.clear(), _result(0, stop="b:1 came", started=12.5, resumed=20, last=44))[1],
        lambda: _result(0, started=16.0, resumed=44, last=90),
    ]
    launched = []

    def launch(world, attempt, changes, stop):
        launched.append((world, attempt, changes))
        clock.advance(3)
        return script[attempt]()

    history, final = run_elastic(
        settings(n=2, lo=1, hi=2),
        view,
        attempts(launch),
        max_restarts=3,
        clock=clock,
        sleep=clock.sleep,
        log=lambda _: None,
    )
    assert launched == [((A, B), 0, 0), ((A,), 1, 1), ((A, B), 2, 2)]
    assert final.exit_code == 0
    changes = history.changes()
    assert [(c["from"], c["to"], c["why"], c["steps_recomputed"]) for c in changes] == [
        (2, 1, "failed", 10),
        (1, 2, "stopped to grow", 0),
    ]
    assert changes[0]["seconds"] == 2.5  # failure noticed at 10.0, the new ranks running at 12.5
    assert history.attempts[0].detail == "rank 1 killed; then b could not be reached"
    text = "\n".join(history.summary())
    assert "3 attempt(s), world size 2 -> 1 -> 2" in text
    assert "shrink 2 -> 1 (failed): 2.50 s from noticing to the new ranks running (" in text
    assert "steps recomputed: 10" in text


def test_failures_beyond_max_restarts_end_the_job_and_growth_does_not_count():
    clock = FakeClock()
    launched = []

    def launch(world, attempt, changes, stop):
        launched.append(attempt)
        return _result(1, message="rank 0 exited with code 1")

    history, final = run_elastic(
        settings(),
        view_of((A, B)),
        attempts(launch),
        max_restarts=2,
        clock=clock,
        sleep=clock.sleep,
        log=lambda _: None,
    )
    assert launched == [0, 1, 2] and final.exit_code == 1 and len(history.attempts) == 3


def test_a_rank_ended_by_the_stop_signal_of_a_grow_is_no_failure_but_one_killed_otherwise_is():
    clock = FakeClock()
    results = [
        JobResult(143, 0, None, 15, message="rank 0 was killed by SIGTERM", stop_reason="b:1 came"),
        JobResult(137, 0, None, 9, message="rank 0 was killed by SIGKILL", stop_reason="b:1 came"),
        _result(0),
    ]

    def launch(world, attempt, changes, stop):
        return results[attempt]

    history, final = run_elastic(
        settings(),
        view_of((A, B)),
        attempts(launch),
        max_restarts=0,
        clock=clock,
        sleep=clock.sleep,
        log=lambda _: None,
    )
    assert [a.outcome for a in history.attempts] == ["stopped to grow", "failed"] and final.exit_code == 137
    assert history.attempts[0].detail == "b:1 came; rank 0 was killed by SIGTERM"


def test_ranks_that_finish_after_a_late_grow_request_end_the_job_instead_of_running_again():
    """A request that arrives after the ranks' last should_stop() (final evaluation, export) finds them
    finishing: they end 0 without saying they stop, and the job is done (it ran its last part 3 times)."""
    clock = FakeClock()
    launched = []

    def launch(world, attempt, changes, stop):
        launched.append(attempt)
        return JobResult(0, stop_reason="b:1 came", guarded=True, stopped_as_asked=False, last_step=90)

    history, final = run_elastic(
        settings(),
        view_of((A, B)),
        attempts(launch),
        max_restarts=3,
        clock=clock,
        sleep=clock.sleep,
        log=lambda _: None,
    )
    assert launched == [0] and final.exit_code == 0 and [a.outcome for a in history.attempts] == ["finished"]


def test_ranks_without_a_guard_that_end_0_after_a_request_still_count_as_stopped_as_asked():
    """Scripts without a PreemptionGuard say nothing: their clean exit after a request is taken as the stop."""
    clock = FakeClock()
    results = [_result(0, stop="b:1 came", guarded=False), _result(0)]
    history, _ = run_elastic(
        settings(),
        view_of((A, B)),
        attempts(lambda w, attempt, c, s: results[attempt]),
        max_restarts=0,
        clock=clock,
        sleep=clock.sleep,
        log=lambda _: None,
    )
    assert [a.outcome for a in history.attempts] == ["stopped to grow", "finished"]


def test_the_guard_says_once_that_the_ranks_stop_because_asked(monkeypatch, capfd):
    monkeypatch.setenv(env.JOB_ID, "job9")
    guard = PreemptionGuard(LocalCommunicator(), signals=())
    guard.should_stop(step=5)
    guard.received = 15  # SIGTERM arrived
    assert guard.should_stop(step=6) and guard.should_stop(step=7)
    reports = RankReports("job9")
    records = [reports.take(f"[rank 0] {line}") for line in capfd.readouterr().err.splitlines()]
    assert [r.get("stopping", False) for r in records] == [False, False, True, False]
    assert reports.training and reports.stopping and reports.last_step == 7


def test_a_stop_of_the_ranks_own_is_decided_with_the_signal_but_is_a_finish_not_a_stop_as_asked(monkeypatch, capfd):
    # A Trainer callback's stop_training (or a step limit) rides on the guard's one allreduce; the
    # launcher must not take it for a stop it asked for (an elastic job would be launched again).
    monkeypatch.setenv(env.JOB_ID, "job9")
    guard = PreemptionGuard(LocalCommunicator(), signals=())
    assert not guard.should_stop(step=1)
    assert guard.should_stop(step=2, also=True) and not guard.stopped
    records = [RankReports("job9").take(f"[rank 0] {line}") for line in capfd.readouterr().err.splitlines()]
    assert [r.get("stopping", False) for r in records] == [False, False]  # steps 1 and 2, neither "stopping"


def test_a_stop_asked_between_checks_counts_at_the_next_check():
    guard = PreemptionGuard(LocalCommunicator(), every=3, signals=())
    assert [guard.should_stop(also=(i == 0)) for i in range(3)] == [False, False, True]


def test_an_elastic_job_that_never_gets_min_np_slots_gives_up_with_its_history():
    clock = FakeClock()
    with pytest.raises(ElasticGaveUp, match="fewer than --min-np 2"):
        run_elastic(
            settings(lo=2, timeout=3), view_of((A,)), None, 1, clock=clock, sleep=clock.sleep, log=lambda _: None
        )


def test_a_stop_request_is_kept_once_with_its_first_reason():
    stop = StopRequest()
    stop.request("b:1 came")
    stop.request("c left")
    assert stop.reason == "b:1 came" and stop.wait(0)


# --- what ranks report, and what they get --------------------------------------------------------


def test_the_step_the_preemption_guard_reports_reaches_the_launcher(monkeypatch, capfd):
    monkeypatch.setenv(env.JOB_ID, "job7")
    guard = PreemptionGuard(LocalCommunicator(), signals=())
    for step in (41, 42, 43):
        guard.should_stop(step=step)
    lines = capfd.readouterr().err.splitlines()
    reports = RankReports("job7")
    for line in lines:
        assert reports.take(f"[rank 0] {line}")["event"] == "step"
    assert (reports.first_step, reports.last_step) == (41, 43)


def test_the_guards_first_call_says_the_ranks_train_even_without_a_step(monkeypatch, capfd):
    monkeypatch.setenv(env.JOB_ID, "job8")
    guard = PreemptionGuard(LocalCommunicator(), signals=())
    guard.should_stop()
    guard.should_stop()
    lines = capfd.readouterr().err.splitlines()
    reports = RankReports("job8")
    assert len(lines) == 1 and reports.take(f"[rank 0] {lines[0]}")["step"] is None
    assert reports.training and reports.first_step is None


def test_a_loop_that_checks_the_guard_at_epoch_ends_reports_where_it_resumed_and_each_step(monkeypatch, capfd):
    # Keras: the guard is checked at epoch ends (step 90 here); the steps in between and the step
    # training resumed at (45) come from progress(). Without "resumed" the launcher would take
    # the first step reported minus one (89) for the resume point, and undercount what was redone.
    monkeypatch.setenv(env.JOB_ID, "job9")
    guard = PreemptionGuard(LocalCommunicator(), signals=())
    guard.progress(45, resumed=True)
    for step in range(46, 91):
        guard.progress(step)
    guard.should_stop(step=90)
    reports = RankReports("job9")
    for line in capfd.readouterr().err.splitlines():
        assert reports.take(f"[rank 0] {line}")["event"] == "step"
    assert (reports.resumed_step, reports.first_step, reports.last_step) == (45, 45, 90) and reports.training


@pytest.mark.parametrize("bad", [-1, 2.5, "7", True, None])
def test_progress_with_a_step_that_is_not_a_count_is_an_error_naming_it(bad):
    with pytest.raises(
        ConfigError, match=rf"step must be an integer >= 0 \(got {re.escape(repr(bad))}\).*optimizer steps done"
    ):
        PreemptionGuard(LocalCommunicator(), signals=()).progress(bad)


def test_the_guard_reports_no_step_outside_hvdkit_run(monkeypatch, capfd):
    monkeypatch.delenv(env.JOB_ID, raising=False)
    PreemptionGuard(LocalCommunicator(), signals=()).should_stop(step=5)
    assert capfd.readouterr().err == ""


# --- hvdkit run ----------------------------------------------------------------------------------


def _script(tmp_path, text):
    path = tmp_path / "discover.sh"
    path.write_text(f"#!/bin/sh\nprintf '{text}'\n")
    path.chmod(0o755)
    return str(path)


@pytest.mark.parametrize(
    "flags, environ",
    [
        ([], {env.OMPI_DEFAULT_SLOTS: "2"}),
        (["--slots-per-host", "2"], {}),
        ([], {env.SLOTS_PER_HOST: "2", env.OMPI_DEFAULT_SLOTS: "cores"}),
    ],
)
def test_bare_host_names_from_discovery_get_the_operators_slots_per_worker(
    flags, environ, tmp_path, capsys, monkeypatch
):
    """The MPI Operator's discover_hosts.sh prints worker names alone; slots reach Open MPI through
    OMPI_MCA_orte_set_default_slots. Read as 1 slot each, a 2 x 2 job started 2 ranks and never grew."""
    for name, value in environ.items():
        monkeypatch.setenv(name, value)
    script = _script(tmp_path, "w0\\nw1\\n")
    assert (
        main(
            [
                "run",
                "-np",
                "4",
                "--min-np",
                "2",
                "--host-discovery-script",
                script,
                *flags,
                "--dry-run",
                "--",
                "python",
                "-c",
                "pass",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out.splitlines()
    assert out[1].startswith("hosts now: w0:2,w1:2 (4 slot(s))") and out[2] == "first launch: 4 rank(s) on w0:2,w1:2:"


def test_a_bare_discovered_host_has_one_slot_without_a_setting_and_listed_slots_always_win():
    assert env.discovered_host_slots(environ={}) == 1
    assert env.discovered_host_slots(environ={env.OMPI_DEFAULT_SLOTS: "sockets"}) == 1
    assert env.discovered_host_slots(3, environ={env.OMPI_DEFAULT_SLOTS: "2"}) == 3
    assert parse_discovery_output("a\nb:5\n", default_slots=4) == (Host("a", 4), Host("b", 5))


def test_dry_run_shows_the_elastic_plan_with_the_hosts_now_and_a_plain_fixed_size_command(tmp_path, capsys):
    script = _script(tmp_path, "n1:2\\nn2:1\\n")
    assert (
        main(
            [
                "run",
                "-np",
                "2",
                "--min-np",
                "1",
                "--max-np",
                "3",
                "--host-discovery-script",
                script,
                "--discovery-interval",
                "2",
                "--dry-run",
                "--",
                "python",
                "-c",
                "pass",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("elastic: start with 2 rank(s), run with 1..3; hosts from --host-discovery-script")
    assert "polled every 2 s" in out[0]
    assert out[1] == "hosts now: n1:2,n2:1 (3 slot(s)); world sizes allowed: 1..3; --max-restarts 10 after failures"
    assert out[2] == "first launch: 2 rank(s) on n1:2:"
    argv = out[3].split()
    assert argv[1:5] == ["-np", "2", "-H", "n1:2"] and argv[-3:] == ["python", "-c", "pass"]
    assert not {"--min-np", "--max-np", "--host-discovery-script", "--elastic"} & set(argv)
    exported = {argv[i + 1] for i, word in enumerate(argv) if word == "-x"}
    assert {
        env.RESTART,
        env.WORLD_SIZE,
        env.MEMBERSHIP_CHANGES,
        env.LINEAGE,
    } <= exported  # every rank, every host gets them


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--min-np", "3"], "--min-np 3 is more than -np 2"),
        (["--max-np", "1"], "-np 2 is more than --max-np 1"),
        (["--min-np", "1", "-H", "a:1,b:1", "--max-np", "3"], "--max-np 3 needs 3 slots"),
        (["--min-np", "1", "--host-discovery-script", "/nonexistent/d.sh"], "is not a file"),
        (["--min-np", "1", "--host-discovery-script", "/bin/true", "-H", "a:2"], "give it without -H/--hostfile"),
        (
            ["--min-np", "1", "-H", "a:1,b:1", "--elastic-timeout", "0"],
            "--elastic-timeout must be a positive number of seconds",
        ),
    ],
)
def test_hvdkit_run_rejects_bad_elastic_combinations_with_a_clear_error(flags, message, capsys):
    assert main(["run", "-np", "2", *flags, "--dry-run", "--", "python", "t.py"]) == 2
    assert message in capsys.readouterr().err


def test_the_elastic_variables_are_read_and_the_flags_win(monkeypatch, tmp_path, capsys):
    monkeypatch.setenv(env.DISCOVERY_INTERVAL, "3")
    monkeypatch.setenv(env.ELASTIC_TIMEOUT, "40")
    script = _script(tmp_path, "n1:2\\n")
    assert main(["run", "-np", "2", "--min-np", "1", "--host-discovery-script", script, "--dry-run", "--", "true"]) == 0
    assert "polled every 3 s; below 1 slot(s) wait up to 40 s" in capsys.readouterr().out
    assert (
        main(
            [
                "run",
                "-np",
                "2",
                "--min-np",
                "1",
                "--host-discovery-script",
                script,
                "--elastic-timeout",
                "9",
                "--dry-run",
                "--",
                "true",
            ]
        )
        == 0
    )
    assert "wait up to 9 s" in capsys.readouterr().out


def test_the_summary_says_unknown_when_ranks_report_no_steps():
    h = History()
    h.attempts = [Attempt((A, B), 0.0, 1.0, 5.0, "failed", "rank 1 died"), Attempt((A,), 6.0, 7.5, 9.0, "finished")]
    h.attempts[0].ended = 5.5
    assert h.changes() == [
        {"from": 2, "to": 1, "why": "failed", "seconds": 2.5, "stopping_seconds": 0.5, "steps_recomputed": None}
    ]
    assert "2.50 s from noticing to the new ranks running (0.50 s of it for the old ranks to end)" in h.summary()[-1]
    assert "steps recomputed: unknown" in h.summary()[-1]


def test_fixed_discovery_lists_the_same_hosts():
    assert FixedDiscovery((A, B), "-H a:1,b:1").hosts() == (A, B)
    assert threading.main_thread()  # the loop's watcher runs beside the launcher's main thread


def test_an_elastic_job_survives_ten_failures_unless_max_restarts_says_otherwise(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv(env.MAX_RESTARTS, raising=False)
    script = _script(tmp_path, "n1:2\\n")
    base = ["run", "-np", "2", "--min-np", "1", "--host-discovery-script", script, "--dry-run"]
    assert main([*base, "--", "true"]) == 0
    assert "--max-restarts 10 after failures" in capsys.readouterr().out
    assert main([*base, "--max-restarts", "2", "--", "true"]) == 0
    assert "--max-restarts 2 after failures" in capsys.readouterr().out
    monkeypatch.setenv(env.MAX_RESTARTS, "0")
    assert main([*base, "--", "true"]) == 0
    assert "--max-restarts 0 after failures" in capsys.readouterr().out


def test_a_hard_stop_finds_every_process_below_the_launcher_also_in_other_sessions():
    import os
    import signal
    import subprocess
    import time

    from hvdkit.launcher.rank_signals import process_tree

    code = "import os, subprocess, time; subprocess.Popen(['sleep', '60'], start_new_session=True); print(os.getpid(), flush=True); time.sleep(60)"
    proc = subprocess.Popen(["python3", "-c", code], stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        proc.stdout.readline()
        time.sleep(0.2)
        found = process_tree(proc.pid)
        assert found[0] == proc.pid and len(found) == 2  # the sleep, though in a session of its own
    finally:
        for pid in process_tree(proc.pid)[::-1]:
            os.kill(pid, signal.SIGKILL)
        proc.wait()


def test_a_discovery_script_run_says_nothing_of_oversubscribing_this_host(tmp_path, capsys):
    """The ranks run on the hosts the script lists, not here: 8 ranks on this host's cores is no concern."""
    script = _script(tmp_path, "n1:4\\nn2:4\\n")
    assert (
        main(
            [
                "run",
                "-np",
                "8",
                "--min-np",
                "4",
                "--host-discovery-script",
                script,
                "--dry-run",
                "--",
                "python",
                "-c",
                "pass",
            ]
        )
        == 0
    )
    assert "share cores" not in capsys.readouterr().err
    assert main(["run", "-np", str(len(os.sched_getaffinity(0)) + 1), "--dry-run", "--", "python", "-c", "pass"]) == 0
    assert "share cores (mpirun --oversubscribe)" in capsys.readouterr().err  # a local run still says it


# --- elastic inside SLURM: node states from SLURM, not ssh -----------------------------------------


def test_inside_slurm_an_mpi_elastic_job_asks_slurm_which_nodes_are_up_and_gloo_or_outside_asks_ssh():
    """Fixed-size runs need no ssh between SLURM nodes (mpirun goes through srun); elastic ones ssh-checked
    every node, so without ssh they trained on the batch node alone."""
    assert job.host_check("mpi", {"SLURM_JOBID": "42"}) is slurm_nodes.unavailable
    assert job.host_check("gloo", {"SLURM_JOBID": "42"}) is remote.unreachable  # horovodrun starts ranks over ssh
    assert job.host_check("mpi", {}) is remote.unreachable


def test_slurm_node_states_leave_out_down_drained_and_not_responding_nodes_with_slurms_word():
    out = "n1 allocated\nn2 down*\nn3 drained\nn4 mixed\nn5 idle~\nn6 allocated*\n"
    calls = []

    def run(argv, **kw):
        calls.append(argv)
        return subprocess.CompletedProcess(argv, 0, out, "")

    hosts = [Host(f"n{i}", 2) for i in range(1, 8)]
    assert slurm_nodes.unavailable(hosts, run=run) == {
        "n2": "SLURM reports it not responding (down*)",
        "n3": "SLURM reports it drained",
        "n5": "SLURM reports it idle~",
        "n6": "SLURM reports it not responding (allocated*)",
        "n7": "not listed by SLURM's sinfo",
    }
    assert calls == [["sinfo", "--noheader", "--nodes=n1,n2,n3,n4,n5,n6,n7", "--format=%n %T"]]

    def failing(argv, **kw):
        return subprocess.CompletedProcess(argv, 1, "", "slurm_load_node: Unable to contact slurm controller")

    assert slurm_nodes.unavailable(hosts, run=failing) == {}  # no answer: the attempt's own failure counts


def test_the_first_attempt_says_which_hosts_it_leaves_out_and_why():
    said = []
    view = view_of((A, B), unreachable={"b": "SLURM reports it drained"})
    run_elastic(
        settings(n=1, lo=1),
        view,
        attempts(lambda *a: _result(0)),
        0,
        clock=FakeClock(),
        sleep=lambda s: None,
        log=said.append,
    )
    assert said[0] == "host b left out: SLURM reports it drained"


# --- checkpoints the next attempt cannot see ------------------------------------------------------


def test_a_relaunch_that_resumes_below_the_last_checkpointed_step_ends_the_job_loudly():
    """A checkpoint folder on one host's disk: rank 0 moves, finds nothing (or an old checkpoint) and
    silently trained from there. The launcher knows the newest step saved, and stops the job."""
    clock, said = FakeClock(), []
    results = [
        JobResult(137, 1, None, 9, message="rank 1 was killed by SIGKILL", resumed_step=0, last_step=40, saved_step=40),
        JobResult(0, resumed_step=0, last_step=90, guarded=True),  # ran to the end, from scratch
    ]
    history, final = run_elastic(
        settings(),
        view_of((A, B)),
        attempts(lambda w, attempt, c, s: results[attempt]),
        max_restarts=3,
        clock=clock,
        sleep=clock.sleep,
        log=said.append,
    )
    assert [a.outcome for a in history.attempts] == ["failed", "resumed behind its checkpoints"]
    assert final.exit_code == 1
    assert final.message.startswith(
        "the ranks resumed at step 0, but an earlier attempt checkpointed step 40: rank 0 "
        "does not see the checkpoints it wrote"
    )
    assert said[-1] == final.message


def test_a_relaunch_that_resumes_at_the_last_checkpointed_step_goes_on():
    results = [
        JobResult(0, stop_reason="b:1 came", guarded=True, stopped_as_asked=True, resumed_step=0, saved_step=40),
        JobResult(0, resumed_step=40, last_step=90, guarded=True),
    ]
    history, final = run_elastic(
        settings(),
        view_of((A, B)),
        attempts(lambda w, attempt, c, s: results[attempt]),
        max_restarts=0,
        clock=FakeClock(),
        sleep=lambda s: None,
        log=lambda _: None,
    )
    assert [a.outcome for a in history.attempts] == ["stopped to grow", "finished"] and final.exit_code == 0


def test_the_watcher_ends_an_attempt_as_soon_as_its_ranks_say_they_resumed_behind_the_checkpoints():
    stop, record = StopRequest(), type("R", (), {"noticed": None})()
    watch(
        view_of((A,)),
        (A,),
        settings(hi=1),
        stop,
        Ended(3),
        record,
        clock=lambda: 7.0,
        log=lambda _: None,
        saved=40,
        progress=Ranks(resumed=12).progress,
    )
    assert (
        stop.is_set() and stop.hard and stop.reason.startswith("the ranks resumed at step 12, but an earlier attempt")
    )


def test_a_checkpoint_save_reports_its_step_to_the_launcher(tmp_path, monkeypatch, capfd):
    from hvdkit.core.checkpoint import CheckpointStore

    monkeypatch.setenv(env.JOB_ID, "job11")
    store = CheckpointStore(str(tmp_path / "ckpt"), LocalCommunicator())
    store.save(lambda folder: open(os.path.join(folder, "w.bin"), "wb").close(), step=40, epoch=1)
    reports = RankReports("job11")
    taken = [reports.take(f"[rank 0] {line}") for line in capfd.readouterr().err.splitlines()]
    assert {"event": "saved", "step": 40, "rank": 0} in taken and reports.saved_step == 40

"""Every documented HVDKIT_* variable is used, a flag or argument still wins over it, and a bad value
is a ConfigError that names the variable and its text (``hvdkit.core.env``)."""

import io
import json
import logging

import pytest
from helpers import PYTHON, run_bounded

from hvdkit.cli import _parser, main
from hvdkit.core import env, log
from hvdkit.core.comm import LocalCommunicator
from hvdkit.core.errors import ConfigError
from hvdkit.core.monitoring.progress import Progress
from hvdkit.core.monitoring.straggler import straggler_threshold
from hvdkit.core.preemption import PreemptionGuard

RUN = ["run", "-np", "1"]
COMMAND = ["--", "python", "-c", "pass"]


def _run_args(*flags):
    return env.resolve(_parser().parse_args([*RUN, *flags, *COMMAND]))


@pytest.fixture(autouse=True)
def _no_hvdkit_variables(monkeypatch):
    for name in (
        env.MAX_RESTARTS,
        env.STALL_TIMEOUT,
        env.GRACE_PERIOD,
        env.NUM_THREADS,
        env.OMP_NUM_THREADS,
        env.LOG_LEVEL,
        env.PROGRESS,
        env.PROGRESS_INTERVAL,
        env.STRAGGLER_THRESHOLD,
    ):
        monkeypatch.delenv(name, raising=False)


# name, flag, the variable's text, the value it gives, a flag value that wins, what the flag gives
CLI_SETTINGS = [
    ("max_restarts", "--max-restarts", env.MAX_RESTARTS, "3", 3, "1", 1),
    ("stall_timeout", "--stall-timeout", env.STALL_TIMEOUT, "45", 45.0, "7.5", 7.5),
    ("grace_period", "--grace-period", env.GRACE_PERIOD, "5", 5.0, "2", 2.0),
]


@pytest.mark.parametrize("dest, flag, name, text, value, flag_text, flag_value", CLI_SETTINGS)
def test_each_run_variable_is_used_and_its_flag_wins(monkeypatch, dest, flag, name, text, value, flag_text, flag_value):
    monkeypatch.setenv(name, text)
    assert getattr(_run_args(), dest) == value
    assert getattr(_run_args(flag, flag_text), dest) == flag_value


@pytest.mark.parametrize("dest, flag, name, text, value, flag_text, flag_value", CLI_SETTINGS)
def test_a_bad_run_variable_is_an_error_naming_it_unless_the_flag_is_given(
    monkeypatch, dest, flag, name, text, value, flag_text, flag_value
):
    monkeypatch.setenv(name, "-x")
    with pytest.raises(ConfigError, match=rf"^{name} must be .*\(got '-x'\); fix or unset it"):
        _run_args()
    assert getattr(_run_args(flag, flag_text), dest) == flag_value  # the flag wins: the variable is not read


def test_run_settings_default_when_neither_flag_nor_variable_is_given():
    args = _run_args()
    assert (args.max_restarts, args.stall_timeout, args.grace_period) == (0, None, 30)


def test_hvdkit_run_names_a_bad_max_restarts_variable_and_its_text(monkeypatch, capsys):
    # Before: "--max-restarts must be an integer >= 0 (got -1)": the flag named, the text replaced by -1.
    monkeypatch.setenv(env.MAX_RESTARTS, "abc")
    assert main([*RUN, "--dry-run", *COMMAND]) == 2
    err = capsys.readouterr().err
    assert "HVDKIT_MAX_RESTARTS must be an integer >= 0 (got 'abc'); fix or unset it" in err


def test_a_flag_that_is_not_a_number_is_a_clear_error_not_an_argparse_exit(capsys):
    assert main([*RUN, "--grace-period", "soon", *COMMAND]) == 2
    assert "--grace-period must be a positive number of seconds (got 'soon')" in capsys.readouterr().err


def test_the_stall_timeout_variable_reaches_the_ranks_and_horovod(monkeypatch, capsys):
    monkeypatch.setenv(env.STALL_TIMEOUT, "90")
    assert env.stall_settings() == {env.HOROVOD_STALL_SHUTDOWN: "90", env.HOROVOD_STALL_CHECK: "30"}
    monkeypatch.setenv(env.HOROVOD_STALL_SHUTDOWN, "12")  # Horovod's own variable wins; the check follows it
    assert env.stall_settings() == {env.HOROVOD_STALL_CHECK: "4"}  # was 30: above 12, Horovod never shut down
    monkeypatch.setenv(env.STALL_TIMEOUT, "0")
    with pytest.raises(ConfigError, match=r"HVDKIT_STALL_TIMEOUT must be a positive number of seconds \(got '0'\)"):
        env.stall_settings()


def test_a_stall_timeout_below_one_second_rounds_up_instead_of_turning_the_shutdown_off(monkeypatch):
    monkeypatch.setenv(env.STALL_TIMEOUT, "0.5")  # Horovod's whole seconds: 0 was "never shut down"
    assert env.stall_settings() == {env.HOROVOD_STALL_SHUTDOWN: "1", env.HOROVOD_STALL_CHECK: "1"}
    monkeypatch.setenv(env.STALL_TIMEOUT, "200.2")
    assert env.stall_settings() == {env.HOROVOD_STALL_SHUTDOWN: "201", env.HOROVOD_STALL_CHECK: "60"}


def test_a_user_check_time_above_the_shutdown_time_is_refused_naming_both(monkeypatch):
    monkeypatch.setenv(env.STALL_TIMEOUT, "20")
    monkeypatch.setenv(env.HOROVOD_STALL_CHECK, "30")  # Horovod: "will not shutdown", waits forever
    with pytest.raises(
        ConfigError, match=r"HOROVOD_STALL_CHECK_TIME_SECONDS=30 is above the stall shutdown time of 20 s"
    ):
        env.stall_settings()
    monkeypatch.setenv(env.HOROVOD_STALL_CHECK, "20")
    assert env.stall_settings() == {env.HOROVOD_STALL_SHUTDOWN: "20"}
    monkeypatch.setenv(env.HOROVOD_STALL_SHUTDOWN, "0")  # the user's own "never": theirs to choose
    assert env.stall_settings() == {}
    monkeypatch.setenv(env.HOROVOD_STALL_SHUTDOWN, "soon")
    with pytest.raises(
        ConfigError, match=r"HOROVOD_STALL_SHUTDOWN_TIME_SECONDS must be an integer >= 0 \(got 'soon'\)"
    ):
        env.stall_settings()


def test_threads_come_from_the_argument_then_hvdkit_then_omp_then_cores_per_local_rank(monkeypatch):
    assert env.num_threads(None, local_size=2, cores=8) == 4
    assert env.num_threads(None, local_size=16, cores=8) == 1
    monkeypatch.setenv(env.OMP_NUM_THREADS, "4,2")  # an OpenMP list: its first entry counts
    assert env.num_threads(None, local_size=2, cores=8) == 4
    monkeypatch.setenv(env.OMP_NUM_THREADS, "3")
    assert env.num_threads(None, local_size=2, cores=8) == 3
    monkeypatch.setenv(env.NUM_THREADS, "5")
    assert env.num_threads(None, local_size=2, cores=8) == 5
    assert env.num_threads(2, local_size=2, cores=8) == 2


@pytest.mark.parametrize("name, text", [(env.NUM_THREADS, "0"), (env.NUM_THREADS, "many"), (env.OMP_NUM_THREADS, "x")])
def test_a_bad_thread_variable_is_an_error_naming_it(monkeypatch, name, text):
    monkeypatch.setenv(name, text)
    with pytest.raises(ConfigError, match=rf"^{name} must be an integer >= 1 \(got '{text}'\)"):
        env.num_threads(None, local_size=1, cores=2)


@pytest.mark.parametrize("bad", [0, True, 2.0, "2"])
def test_a_bad_threads_argument_is_an_error(bad):
    with pytest.raises(ConfigError, match=rf"threads must be an integer >= 1 \(got {bad!r}\)"):
        env.num_threads(bad)


_BOTH_RUNTIMES = """
import json, torch, tensorflow as tf
from hvdkit.core.topology import Topology
from hvdkit.tensorflow import runtime as tf_runtime
from hvdkit.torch import runtime as torch_runtime
topo = Topology(1, 2, 1, 2)  # on_start only sets threads (Runtime logs the start-up line): no Horovod needed
torch.set_num_threads(1)
torch_runtime._on_start(topo, None)
tf_runtime._on_start(topo, None)
print(json.dumps([torch.get_num_threads(), tf.config.threading.get_intra_op_parallelism_threads()]))
"""


def test_torch_and_tensorflow_runtimes_take_the_same_threads_from_omp_num_threads():
    # Before: torch left its own thread count once OMP_NUM_THREADS was set (here 1, not 3), and
    # TensorFlow failed on an OpenMP list ("3,1"). In a process of its own: TF sets variables on import.
    proc = run_bounded(
        [PYTHON, "-c", _BOTH_RUNTIMES], timeout=300, env={env.OMP_NUM_THREADS: "3,1", env.NUM_THREADS: ""}
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == [3, 3]


def test_the_log_level_variable_is_used_and_the_argument_wins(monkeypatch):
    monkeypatch.setitem(log._state, "handler", logging.NullHandler())  # no handler installed by the test
    logger = logging.getLogger("hvdkit")
    before = logger.level
    try:
        monkeypatch.setenv(env.LOG_LEVEL, "warning")
        assert log.configure().level == logging.WARNING
        assert log.configure("DEBUG").level == logging.DEBUG
    finally:
        logger.setLevel(before)


def test_a_bad_log_level_is_an_error_naming_the_variable_and_the_levels(monkeypatch):
    # Before: logging's own ValueError("Unknown level: 'VERBOSE'"), not naming HVDKIT_LOG_LEVEL.
    monkeypatch.setitem(log._state, "handler", logging.NullHandler())
    monkeypatch.setenv(env.LOG_LEVEL, "verbose")
    with pytest.raises(
        ConfigError, match=r"HVDKIT_LOG_LEVEL must be one of DEBUG, INFO, WARNING, ERROR, CRITICAL \(got 'verbose'\)"
    ):
        log.configure()


def test_the_progress_variables_are_used_and_the_interval_argument_wins(monkeypatch):
    stream = io.StringIO()  # not a terminal: off by default
    assert not Progress(10, stream=stream).enabled
    monkeypatch.setenv(env.PROGRESS, "on")
    monkeypatch.setenv(env.PROGRESS_INTERVAL, "2.5")
    bar = Progress(10, stream=stream)
    assert bar.enabled and bar.interval == 2.5
    assert Progress(10, stream=stream, interval=4).interval == 4
    monkeypatch.setenv(env.PROGRESS, "0")
    assert not Progress(10, stream=stream).enabled


@pytest.mark.parametrize("name, text", [(env.PROGRESS, "maybe"), (env.PROGRESS_INTERVAL, "-1")])
def test_a_bad_progress_variable_is_an_error_naming_it(monkeypatch, name, text):
    monkeypatch.setenv(name, text)
    with pytest.raises(ConfigError, match=rf"^{name} must be .*\(got '{text}'\); fix or unset it"):
        Progress(10, stream=io.StringIO())


def test_the_straggler_threshold_variable_is_used_and_the_argument_wins(monkeypatch):
    monkeypatch.setenv(env.STRAGGLER_THRESHOLD, "1.5")
    assert straggler_threshold() == 1.5
    assert straggler_threshold(2.0) == 2.0
    monkeypatch.setenv(env.STRAGGLER_THRESHOLD, "1")
    with pytest.raises(ConfigError, match=r"^HVDKIT_STRAGGLER_THRESHOLD must be a finite number > 1.0.*\(got '1'\)"):
        straggler_threshold()


@pytest.mark.parametrize(
    "name, text, value",
    [("I", "7", 7), ("F", "0.25", 0.25), ("C", "sqrt", "sqrt"), ("B", "yes", True)],
)
def test_the_typed_readers_read_each_kind(name, text, value):
    environ = {name: text}
    read = {
        "I": lambda: env.read_int("I", 0, environ=environ),
        "F": lambda: env.read_float("F", 1.0, environ=environ),
        "C": lambda: env.read_choice("C", ("linear", "sqrt"), "linear", environ=environ),
        "B": lambda: env.flag("B", False, environ=environ),
    }[name]
    assert read() == value


def test_the_typed_readers_give_the_default_when_unset_and_name_a_bad_value():
    assert env.read_int("I", 9, environ={}) == 9
    assert env.read_choice("C", ("a", "b"), "a", environ={"C": " "}) == "a"
    with pytest.raises(ConfigError, match=r"^I must be an integer >= 2 \(got '1'\); fix or unset it$"):
        env.read_int("I", 9, minimum=2, environ={"I": "1"})
    with pytest.raises(ConfigError, match=r"^F must be a finite number > 0 \(got 'inf'\)"):
        env.read_float("F", 1.0, environ={"F": "inf"})
    with pytest.raises(ConfigError, match=r"^C must be one of a, b \(got 'c'\)"):
        env.read_choice("C", ("a", "b"), "a", environ={"C": "c"})


def test_the_preemption_guard_rejects_true_and_zero_as_its_interval():
    # Before: max(1, int(every)) turned True and 0 into 1 silently.
    for bad in (True, 0, "2"):
        with pytest.raises(ConfigError, match=rf"every must be an integer >= 1 \(got {bad!r}\)"):
            PreemptionGuard(LocalCommunicator(), every=bad)
    assert PreemptionGuard(LocalCommunicator(), every=3).every == 3


_KERAS_TRUE = """
import json
from hvdkit.core.errors import ConfigError
from hvdkit.keras.callbacks import CheckpointCallback, LearningRateWarmupCallback
from hvdkit.keras.monitoring import ProgressBarCallback
errors = []
for make in (lambda: LearningRateWarmupCallback(True), lambda: LearningRateWarmupCallback(0.1, warmup_epochs=True),
             lambda: CheckpointCallback("unused", every=True), lambda: ProgressBarCallback(batch_size=True)):
    try:
        make()
        errors.append(None)
    except ConfigError as e:
        errors.append(str(e))
print(json.dumps(errors))
"""


def test_keras_callbacks_reject_true_as_a_number():
    # Before: isinstance(True, int) let True through as 1 (learning rate, epochs, interval, batch).
    # In a process of its own: TensorFlow sets variables on import.
    proc = run_bounded([PYTHON, "-c", _KERAS_TRUE], timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == [
        "initial_lr must be a positive number (got True)",
        "warmup_epochs must be an integer >= 0 (got True)",
        "every must be an integer >= 1 (got True)",
        "batch_size must be a positive integer, the per-rank batch (got True)",
    ]

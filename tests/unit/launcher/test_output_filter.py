"""What `hvdkit run` leaves out of the output (hvdkit.launcher.quiet): start-up chatter, and the
launcher's own failure report when hvdkit names the failed rank itself."""

from hypothesis import given
from hypothesis import strategies as st

from hvdkit.launcher.quiet import OutputFilter, is_startup_chatter

ABSL = "WARNING: All log messages before absl::InitializeLog() is called are written to STDERR\n"
ONEDNN = (
    "I0000 00:00:1795420357.671281   21055 port.cc:153] oneDNN custom operations are on. You may see slightly "
    "different numerical results due to floating-point round-off errors from different computation orders. "
    "To turn them off, set the environment variable `TF_ENABLE_ONEDNN_OPTS=0`.\n"
)
CPU_GUARD = [
    "I0000 00:00:1795420357.730533   21055 cpu_feature_guard.cc:227] This TensorFlow binary is optimized to use "
    "available CPU instructions in performance-critical operations.\n",
    "To enable the following instructions: AVX2 AVX512F FMA, in other operations, rebuild TensorFlow with the "
    "appropriate compiler flags.\n",
]
TF_WARNING = "W0000 00:00:1795420357.730533   21055 op_kernel.cc:1857] OP_REQUIRES failed: out of memory\n"
DASH = "-" * 74 + "\n"
MPIRUN_BANNER = [
    DASH,
    "Primary job  terminated normally, but 1 process returned\n",
    "a non-zero exit code. Per user-direction, the job has been aborted.\n",
    DASH,
    DASH,
    "mpirun detected that one or more processes exited with non-zero status, thus causing\n",
    "the job to be terminated. The first process to do so was:\n",
    "\n",
    "  Process name: [[15282,1],1]\n",
    "  Exit code:    3\n",
    DASH,
]
MPIRUN_OTHER = [
    DASH,
    "There are not enough slots available in the system to satisfy the 4\n",
    "slots that were requested.\n",
    DASH,
]
HOROVODRUN_REPORT = [
    "Process 1 exit with status code 3.\n",
    "Terminating remaining workers after failure of Process 1.\n",
    "Process 0 exit with status code 143.\n",
    "Traceback (most recent call last):\n",
    '  File "/venv/bin/horovodrun", line 6, in <module>\n',
    "    sys.exit(run_commandline())\n",
    "             ^^^^^^^^^^^^^^^^^\n",
    "RuntimeError: Horovod detected that one or more processes exited with non-zero status, thus causing the "
    "job to be terminated. The first process to do so was:\n",
    "Process name: 1\n",
    "Exit code: 3\n",
    "\n",
]
OTHER_TRACEBACK = [
    "Traceback (most recent call last):\n",
    '  File "/venv/bin/horovodrun", line 6, in <module>\n',
    "ValueError: Invalid host input, please make sure it has format as : worker-0:2,worker-1:2.\n",
]


def run_through(lines, rank_failed, verbose=False):
    f = OutputFilter(verbose=verbose)
    shown = []
    for stream, text in lines:
        shown += f.feed(stream, text)
    return shown + f.end(rank_failed=rank_failed)


def err(lines):
    return [("stderr", t) for t in lines]


def test_tensorflow_start_up_info_lines_are_chatter_on_ranks_and_on_the_launcher():
    for line in [ABSL, ONEDNN, *CPU_GUARD]:
        assert is_startup_chatter(line)
        assert is_startup_chatter("[rank 1] " + line)
    assert not is_startup_chatter(TF_WARNING)
    assert not is_startup_chatter("[rank 0/2] hvdkit.torch: 2 rank(s) over MPI\n")
    assert not is_startup_chatter("[rank 0] I0000 is what my model prints\n")


def test_the_mpirun_banner_is_dropped_when_hvdkit_names_the_failed_rank():
    lines = err(["[rank 1] failing on purpose\n", *MPIRUN_BANNER])
    assert run_through(lines, rank_failed=True) == lines[:1]


def test_the_mpirun_banner_is_shown_when_no_rank_reported_a_failure():
    lines = err(["[rank 1] failing on purpose\n", *MPIRUN_BANNER])
    assert run_through(lines, rank_failed=False) == lines


def test_an_mpirun_message_that_is_not_about_a_failed_rank_is_shown_at_once():
    f = OutputFilter()
    shown = [t for line in MPIRUN_OTHER for _, t in f.feed("stderr", line)]
    assert shown == MPIRUN_OTHER


def test_horovodruns_failure_lines_and_traceback_are_dropped_when_hvdkit_names_the_rank():
    lines = err(["[rank 1] failing on purpose\n", *HOROVODRUN_REPORT, "next launcher line\n"])
    assert run_through(lines, rank_failed=True) == err(["[rank 1] failing on purpose\n", "next launcher line\n"])


def test_any_other_launcher_traceback_is_shown_whole_at_once():
    f = OutputFilter()
    shown = [t for line in OTHER_TRACEBACK for _, t in f.feed("stderr", line)]
    assert shown == OTHER_TRACEBACK


def test_debug_level_leaves_everything_in():
    lines = err([ABSL, ONEDNN, *CPU_GUARD, *MPIRUN_BANNER, *HOROVODRUN_REPORT])
    assert run_through(lines, rank_failed=True, verbose=True) == lines


def test_a_rank_line_ends_an_unfinished_banner_which_is_then_shown_before_it():
    lines = err([DASH, "half a banner\n", "[rank 0] step 1\n"])
    assert run_through(lines, rank_failed=True) == lines


RANK_TEXT = st.text(alphabet=st.characters(blacklist_categories=("Cs", "Cc")), max_size=30).map(lambda s: s + "\n")
LINE = st.one_of(
    st.tuples(
        st.sampled_from(["stdout", "stderr"]), st.builds(lambda r, t: f"[rank {r}] {t}", st.integers(0, 9), RANK_TEXT)
    ),
    st.tuples(st.just("stderr"), RANK_TEXT),
    st.sampled_from(err([ABSL, ONEDNN, *CPU_GUARD, *MPIRUN_BANNER, *HOROVODRUN_REPORT, *OTHER_TRACEBACK])),
)


@given(st.lists(LINE, max_size=40))
def test_without_a_rank_failure_only_chatter_is_lost_and_rank_lines_keep_their_order(lines):
    shown = run_through(lines, rank_failed=False)
    kept = [line for line in lines if not is_startup_chatter(line[1])]
    assert sorted(shown) == sorted(kept)
    ranks = [line for line in lines if line[1].startswith("[rank ") and not is_startup_chatter(line[1])]
    assert [line for line in shown if line[1].startswith("[rank ")] == ranks


@given(st.lists(LINE, max_size=40))
def test_with_a_rank_failure_no_rank_line_is_ever_lost(lines):
    shown = run_through(lines, rank_failed=True)
    ranks = [line for line in lines if line[1].startswith("[rank ") and not is_startup_chatter(line[1])]
    assert [line for line in shown if line[1].startswith("[rank ")] == ranks

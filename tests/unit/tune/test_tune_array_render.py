"""`hvdkit render slurm --tune W`: a SLURM job array of W `hvdkit tune` workers on one shared study.

Examples: the #SBATCH lines (array 0..W-1, one node, --parallel x -np slots), the study name fixed in
the script, each task's own results folder, and the refusals (no --storage, a storage inside --out,
job flags that do not apply, a command that is not hvdkit tune). Hypothesis: for commands, storage
paths and folders holding quotes, `$`, backticks, newlines and any other text, bash running the
script (with a recorder in place of hvdkit) starts exactly `hvdkit tune` with the given options,
`--out OUT/task-N` and the training command, and the header's render line renders the same file."""

import shlex

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from unit.launcher.render.rendered_scripts import argv_the_script_runs, bash_syntax_ok

from hvdkit import cli
from hvdkit.cli.render import plan_array
from hvdkit.core.errors import ConfigError
from hvdkit.tune.array import render_tune_array

FAST = settings(
    max_examples=25, deadline=None, derandomize=True, database=None, suppress_health_check=[HealthCheck.too_slow]
)
TUNE = ["hvdkit", "tune", "--space", "s.yaml", "--metric", "val_loss", "--mode", "min", "--trials", "8"]
TRAIN = ["--", "python", "train.py", "--epochs", "3", "--checkpoint-dir", "{trial_dir}/ck"]


def _cli(*argv, capsys):
    code = cli.main(["render", "slurm", *argv])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_the_array_has_one_task_per_worker_each_one_node_of_parallel_times_np_cpus(capsys):
    argv = ["--tune", "3", "--name", "dig", "--memory", "3Gi", "--", *TUNE, "--parallel", "2", "-np", "2"]
    code, text, err = _cli(*argv, "--storage", "/shared/s.journal", "--out", "res", *TRAIN, capsys=capsys)
    assert code == 0, err
    sbatch = [line for line in text.splitlines() if line.startswith("#SBATCH")]
    assert sbatch == [
        "#SBATCH --job-name=dig",
        "#SBATCH --array=0-2",
        "#SBATCH --nodes=1",
        "#SBATCH --ntasks=4",
        "#SBATCH --cpus-per-task=1",
        "#SBATCH --mem=3G",
    ]
    last = text.splitlines()[-1]
    assert last.startswith("exec hvdkit tune --space s.yaml ")
    assert '--storage /shared/s.journal --study dig --out res/task-"$SLURM_ARRAY_TASK_ID" -- python' in last


def test_a_study_name_given_is_kept_and_not_given_twice():
    array = plan_array([*TUNE, "--study", "mine", "--storage", "/s/j", *TRAIN], 2, "job")
    assert array.options.count("--study") == 1 and array.options[array.options.index("--study") + 1] == "mine"
    array = plan_array([*TUNE, "--study=mine", "--storage", "/s/j", "--out=o", *TRAIN], 2, "job")
    assert "--study" not in array.options and array.out == "o" and "--out=o" not in array.options


@pytest.mark.parametrize(
    "extra, match",
    [
        ([], "needs a --storage every node reaches"),
        (["--storage", "res/study.journal", "--out", "res"], "--storage 'res/study.journal' lies in --out 'res'"),
        (["--storage", "tune-out/j"], "lies in --out 'tune-out'"),  # the default --out
    ],
)
def test_a_storage_the_tasks_cannot_share_is_refused_with_the_fix(extra, match):
    with pytest.raises(ConfigError, match=match) as e:
        plan_array([*TUNE, *extra, *TRAIN], 2, "job")
    assert "--storage /shared/tune/study.journal" in str(e.value)


def test_what_is_not_an_hvdkit_tune_worker_is_refused(capsys):
    with pytest.raises(ConfigError, match="--tune renders hvdkit tune workers"):
        plan_array(["python", "train.py"], 2, "job")
    with pytest.raises(ConfigError, match="does not parse"):
        plan_array(["hvdkit", "tune", "--space", "s.yaml", "--storage", "/s/j", *TRAIN], 2, "job")
    with pytest.raises(ConfigError, match="has no training command"):
        plan_array([*TUNE, "--storage", "/s/j"], 2, "job")
    with pytest.raises(ConfigError, match=r"--tune must be the number of workers .* \(got 0\)"):
        plan_array([*TUNE, "--storage", "/s/j", *TRAIN], 0, "job")
    code, _, err = _cli(
        "--tune", "2", "--nodes", "2", "-np", "4", "--", *TUNE, "--storage", "/s", *TRAIN, capsys=capsys
    )
    assert code != 0 and "drop --num-proc, --nodes" in err


WORD = st.text(
    st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), min_size=1, max_size=12
) | st.sampled_from(["$HOME", "`id`", "a b", "'", '"', "\n", "#x", "$(ls)", "--", "\\", "$SLURM_ARRAY_TASK_ID"])
FOLDER = st.text(st.sampled_from("ab $'\"`\n#\\é"), min_size=1, max_size=8).filter(lambda s: s.strip("/") == s)


@FAST
@given(train=st.lists(WORD, max_size=4), storage=FOLDER, out=FOLDER, workers=st.integers(1, 64))
@example(train=["$(rm -rf x)", "a\nb"], storage="s p", out="o'ut", workers=2)
def test_the_script_starts_exactly_the_worker_command_with_its_task_folder(train, storage, out, workers):
    import tempfile

    command = [*TUNE, "--storage", "/shared/" + storage, "--out", out, "--", "python", "t.py", *train]
    array = plan_array(command, workers, "job")  # /shared/... never lies in the relative --out
    text = render_tune_array(array)
    assert f"#SBATCH --array=0-{workers - 1}\n" in text
    with tempfile.TemporaryDirectory() as d:
        ok, err = bash_syntax_ok(text, d)
        assert ok, err
        code, argv, err = argv_the_script_runs(text, "hvdkit", d, env={"SLURM_ARRAY_TASK_ID": "1"})
    assert code == 0, err
    expected = ["tune", *TUNE[2:], "--storage", "/shared/" + storage, "--study", "job", "--out", f"{out}/task-1"]
    assert argv == [*expected, "--", "python", "t.py", *train]
    # the header's render line (printable words only, as shlex reads them) gives the same file again
    line = next(x for x in text.splitlines() if x.startswith("#   hvdkit render slurm --tune"))
    if all(w.isprintable() for w in [*train, storage, out]):
        again = shlex.split(line[4:])
        cut = again.index("--")
        assert again[:cut] == ["hvdkit", "render", "slurm", "--tune", str(workers), "--name", "job", "--memory", "2Gi"]
        assert render_tune_array(plan_array(again[cut + 1 :], workers, "job")) == text

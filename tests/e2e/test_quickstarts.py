"""The quickstarts in docs/ run as written, on 2 real ranks, and do what their text says.

The script is taken verbatim from the Markdown (its one ```python block) and started the way the
page says: ``hvdkit run -np 2 -- python FILE`` in a fresh folder.
"""

import re

import pytest
import tensorflow  # noqa: F401 - the event reader loads it; its environment variables are set before any test
from helpers import HVDKIT, PYTHON, ROOT, run_bounded
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

pytestmark = pytest.mark.dist

PAGES = {"torch": "quickstart-torch.md", "keras": "quickstart-keras.md"}


def script_of(page):
    blocks = re.findall(r"```python\n(.*?)```", (ROOT / "docs" / page).read_text(encoding="utf-8"), re.S)
    assert len(blocks) == 1, f"{page} must hold exactly one python block (the script to copy)"
    return blocks[0]


def run_quickstart(folder, name):
    env = {"HVDKIT_PROGRESS": "1", "HVDKIT_PROGRESS_INTERVAL": "0.001"}
    return run_bounded([HVDKIT, "run", "-np", "2", "--", PYTHON, name], timeout=300, env=env, cwd=folder)


def scalars(logdir, tag):
    acc = EventAccumulator(str(logdir))
    acc.Reload()
    return [(e.step, e.value) for e in acc.Scalars(tag)]


@pytest.fixture(scope="module", params=sorted(PAGES))
def quickstart(request, tmp_path_factory):
    which = request.param
    folder = tmp_path_factory.mktemp(f"quickstart-{which}")
    name = f"train_{which}.py"
    (folder / name).write_text(script_of(PAGES[which]), encoding="utf-8")
    first = run_quickstart(folder, name)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    again = run_quickstart(folder, name)  # resumes from the last checkpoint: nothing left to train
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    return which, folder, first, again


def test_the_quickstart_trains_to_a_good_accuracy(quickstart):
    which, _, first, _ = quickstart
    done = [ln for ln in first.stdout.splitlines() if "done:" in ln]
    assert len(done) == 1 and done[0].startswith("[rank 0]")
    accuracy = float(
        re.search(
            r"(?:val_)?accuracy (\d\.\d+)", done[0] if which == "keras" else first.stdout.split("epoch 4:")[1]
        ).group(1)
    )
    assert accuracy > 0.85


def test_progress_is_shown_by_rank_0_only_with_throughput_and_eta(quickstart):
    _, _, first, _ = quickstart
    bars = [ln for ln in (first.stdout + first.stderr).splitlines() if "/s elapsed" in ln]
    assert bars and all(ln.startswith("[rank 0]") for ln in bars)
    assert any("samples/s" in ln and " eta " in ln and "epoch 4/4" in ln for ln in bars)


def test_tensorboard_holds_the_averaged_metrics_rank_0_printed(quickstart):
    which, folder, first, _ = quickstart
    logdir = folder / "runs" / f"quickstart-{which}"
    val = scalars(logdir, "val_accuracy")
    assert [s for s, _ in val] == [0, 1, 2, 3]
    text = first.stdout + first.stderr
    printed = [float(v) for v in re.findall(r"epoch \d/?\d*: .*?val_accuracy (\d\.\d+)", text)]
    assert len(printed) == 4
    assert [round(v, 4) for _, v in val] == pytest.approx(printed, abs=1e-4)
    assert (logdir / "mlflow.db").stat().st_size > 0


def test_a_second_run_resumes_from_the_checkpoint_and_trains_nothing(quickstart):
    _, _, _, again = quickstart
    text = again.stdout + again.stderr
    assert "epoch 1/4" not in text and "saved checkpoint" not in text
    assert "done:" in again.stdout

"""Two `hvdkit tune` workers on one study (a shared --storage): their command lines and the checks that
together they ran the study once: exactly N finished trials, no trial number run by both, each
worker's trials in the one study, and the last worker's best.json the best of all of them."""

import csv
import json
import re
import subprocess

from helpers import HVDKIT, PYTHON, ROOT

TRIALS = 4
STUDY = "shared"
SPACE = "lr: {type: float, low: 0.03, high: 0.3, log: true}\n"
# one epoch of the digits example per trial; {trial_dir} keeps each trial's checkpoints apart
COMMAND = ("examples/torch_digits.py", "--epochs", "1", "--compression", "none", "--checkpoint-dir", "{trial_dir}/ck")


def worker_argv(space, out, storage, seed, hvdkit=HVDKIT, python=PYTHON):
    """One worker: `hvdkit tune` on the study STUDY in `storage`, one 1-rank trial at a time."""
    return [
        hvdkit,
        "tune",
        "--space",
        str(space),
        "--metric",
        "val_loss",
        "--mode",
        "min",
        "--trials",
        str(TRIALS),
        "--parallel",
        "1",
        "-np",
        "1",
        "--pruner",
        "none",
        "--seed",
        str(seed),
        "--storage",
        storage,
        "--study",
        STUDY,
        "--out",
        str(out),
        "--status-interval",
        "5",
        "--",
        python,
        *(str(ROOT / w) if w.endswith(".py") else w for w in COMMAND),
    ]


def run_two(argvs, timeout=400):
    """Start both workers at once and wait for both; their (returncode, output) pairs."""
    procs = [
        subprocess.Popen(
            a, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
        )
        for a in argvs
    ]
    try:
        return [(p.wait(timeout=timeout), p.stdout.read()) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()  # the worker's own session: its trials end with it (their hvdkit run sees it go)
                p.wait()


def started(output):
    """The trial numbers this worker started, in order."""
    return [int(n) for n in re.findall(r"^trial (\d+) started", output, re.M)]


def check_one_study(results, outs, study):
    """The properties of two workers on one study (see the module docstring); `study` is the study
    loaded from the storage after both ended. Returns the numbers each worker ran."""
    for code, output in results:
        assert code == 0, output[-5000:]
    ran = [started(output) for _, output in results]
    assert all(ran), f"each worker ran trials: {ran}\n" + "\n----\n".join(o[-3000:] for _, o in results)
    assert not set(ran[0]) & set(ran[1]), ran  # no trial number run twice
    assert len(ran[0]) == len(set(ran[0])) and len(ran[1]) == len(set(ran[1])), ran
    trials = study.get_trials()
    states = {t.number: t.state.name for t in trials}
    complete = sorted(n for n, s in states.items() if s == "COMPLETE")
    assert len(complete) == TRIALS, states  # exactly N, not N per worker
    assert set(complete) <= set(ran[0]) | set(ran[1]), (complete, ran)
    for n in set(ran[0]) | set(ran[1]):  # a started trial ran to its end (nothing left RUNNING)
        assert states[n] in ("COMPLETE", "FAIL"), states
    best = min((t for t in trials if t.state.name == "COMPLETE"), key=lambda t: t.value)

    # the worker whose last trial finished last read the study after every trial had finished: its CSV has them
    # all and its best.json is the study's best. Which one that is cannot be told from the files' times (under
    # load 4-12 the other worker once wrote its files later, from a read made before the last trial finished).
    def complete_in_csv(i):
        with open(outs[i] / "trials.csv", newline="") as f:
            return sorted(int(r["number"]) for r in csv.DictReader(f) if r["state"] == "COMPLETE")

    in_csv = [complete_in_csv(i) for i in range(2)]
    saw_all = [i for i in range(2) if in_csv[i] == complete]
    assert saw_all, (complete, in_csv)
    last = saw_all[0]
    data = json.loads((outs[last] / "best.json").read_text())
    assert (data["study"], data["number"], data["value"]) == (STUDY, best.number, best.value)
    assert data["params"] == best.params
    # the other worker's best.json is the best of what had finished when it ended: never better than the study's
    other = json.loads((outs[1 - last] / "best.json").read_text())
    assert other["value"] >= best.value and other["study"] == STUDY
    return ran

"""``python tune_taken_over.py --journal J --trial-dir D --x X``: a trial that another worker takes over once.

The first time (no ``D/taken``) it does what an ``hvdkit tune`` worker does to the trial of a worker it
judged gone: once its own ``hvdkit tune`` has recorded the trial's job, it records the trial FAIL and
queues its parameters again (same key, attempt 1); then it reports ``loss = X`` for epoch 0, which its
own ``hvdkit tune`` can no longer tell the study, and exits 0. Run again (``D/taken`` exists) it only
reports ``loss = X``.
"""

import argparse
import os
import sys
import time

import optuna

import hvdkit.tune
from hvdkit.tune.storage import open_storage


def take_over(journal: str, number: int) -> None:
    study = optuna.load_study(storage=open_storage(journal, "."), study_name="hvdkit-tune")
    deadline = time.monotonic() + 60
    while "hvdkit_job" not in study.get_trials()[number].user_attrs:  # its driver is done starting it
        if time.monotonic() > deadline:
            raise SystemExit("tune_taken_over: the trial's job was never recorded")
        time.sleep(0.05)
    trial = study.get_trials()[number]
    study.tell(number, state=optuna.trial.TrialState.FAIL)
    study.enqueue_trial(dict(trial.params), user_attrs={"hvdkit_key": number, "hvdkit_attempt": 1})


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--journal", required=True)
    p.add_argument("--trial-dir", required=True)
    p.add_argument("--x", type=float, required=True)
    args = p.parse_args()
    marker = os.path.join(args.trial_dir, "taken")
    if not os.path.exists(marker):
        take_over(args.journal, int(os.environ["HVDKIT_TUNE_TRIAL"]))
        open(marker, "w").close()
    hvdkit.tune.report(0, loss=args.x)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""What the digits examples share: the data split and the command-line flags.

scikit-learn ships the 1,797 8x8 digit images, so nothing is downloaded. Every rank builds the
same 80/20 split from the seed, then takes its shard.
"""

import argparse
import gzip
import importlib.util
import sys
from pathlib import Path

import numpy as np

from hvdkit.core import HvdkitError

COMPRESSIONS = ("none", "fp16", "auto")


def load_digits():
    """scikit-learn's bundled digits, ``(x, y)``: 1,797 flattened 8x8 images (float64, 0-16) and their labels,
    exactly what ``sklearn.datasets.load_digits(return_X_y=True)`` returns. Read from the file scikit-learn
    ships, the way it reads it, because importing ``sklearn.datasets`` (scipy, pandas) costs every rank of
    every run about 1.6 s on a 2-core machine, more than a short training run; through scikit-learn when
    that file is not where this version keeps it."""
    spec = importlib.util.find_spec("sklearn")  # finds the package without importing it
    path = Path(spec.origin).parent / "datasets" / "data" / "digits.csv.gz" if spec and spec.origin else None
    if path is None or not path.is_file():
        from sklearn.datasets import load_digits as sklearn_load_digits

        return sklearn_load_digits(return_X_y=True)
    with gzip.open(path, "rt", encoding="utf-8") as f:
        data = np.loadtxt(f, delimiter=",")
    return data[:, :-1], data[:, -1].astype(int)


def load_split(seed):
    """``(x_train, y_train, x_val, y_val)``: float32 features in [0, 1], int64 labels."""
    x, y = load_digits()
    x = (x / 16.0).astype(np.float32)
    y = y.astype(np.int64)
    order = np.random.RandomState(seed).permutation(len(x))
    cut = int(0.8 * len(x))
    train, val = order[:cut], order[cut:]
    return x[train], y[train], x[val], y[val]


def parse_args(description, default_checkpoint_dir, argv=None, add_flags=None):
    """The flags every digits example takes, and those ``add_flags(parser)`` adds (one example's own)."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--epochs", type=int, default=12, help="total epochs (a resumed run continues to this)")
    p.add_argument("--batch-size", type=int, default=32, help="per-rank batch size")
    p.add_argument("--lr", type=float, default=0.05, help="SGD learning rate")
    p.add_argument(
        "--lr-decay",
        type=float,
        default=None,
        metavar="GAMMA",
        help="keras_digits.py: decay the rate by GAMMA per epoch's worth of optimizer steps, smoothly "
        "(a Keras ExponentialDecay schedule; default: constant). "
        "the torch examples anneal by cosine per epoch",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--compression",
        default="auto",
        help=f"gradient compression: {', '.join(COMPRESSIONS)} (auto: the faster, timed at start)",
    )
    p.add_argument("--checkpoint-dir", default=default_checkpoint_dir, help="where rank 0 keeps checkpoints")
    p.add_argument("--keep", type=int, default=3, help="checkpoints to keep")
    p.add_argument(
        "--global-batch-size",
        type=int,
        default=None,
        help="samples per optimizer step over all ranks, kept at any world size by gradient accumulation "
        "(default: batch size x ranks)",
    )
    p.add_argument(
        "--sample-log", default=None, help="each rank appends the sample indices of every step to PATH.rank<r>"
    )
    p.add_argument(
        "--stop-at-step", type=int, default=None, help="stop after this optimizer step as on SIGTERM (checkpoint, exit)"
    )
    if add_flags is not None:
        add_flags(p)
    return p.parse_args(argv)


class SampleLog:
    """``--sample-log PATH``: rank r appends one JSON line per optimizer step to ``PATH.rank<r>``.

    ``{"epoch": e, "step": s, "rank": r, "size": n, "time": t, "indices": [...]}``: the dataset indices
    (into the training split) this rank trained on in optimizer step ``s`` (counted over the whole
    run, 1 for the first) of epoch ``e`` (0-based), at wall-clock time ``t``. Lines are appended, so
    the logs of a run that was stopped and resumed, at any world size, add up to the whole training.
    ``rank`` and ``size`` may be functions, asked at every write (under in-process recovery they
    change in the same process; steps redone after a recovery are logged again, later in time).
    """

    def __init__(self, path, rank, size):
        self.base = path
        self.rank, self.size = rank, size

    @property
    def path(self):
        return f"{self.base}.rank{_now(self.rank)}" if self.base else None

    def write(self, epoch, step, indices):
        if self.base is None:
            return
        import json
        import time

        rank, size = _now(self.rank), _now(self.size)
        line = {"epoch": int(epoch), "step": int(step), "rank": rank, "size": size, "time": time.time()}
        line["indices"] = [int(i) for i in indices]
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(json.dumps(line) + "\n")


def _now(value):
    return value() if callable(value) else value


def result_line(world_size, args, start_epoch, steps, val_accuracy, val_loss, preempted=False, compression=None):
    """The one JSON line every example prints on rank 0 at the end.

    ``compression``: what the optimizer used (its ``compression``: what ``"auto"`` chose), else ``--compression``.
    """
    import json

    return json.dumps(
        {
            "preempted": preempted,
            "world_size": world_size,
            "epochs": args.epochs,
            "resumed_from_epoch": start_epoch,
            "steps": steps,
            "val_accuracy": None if val_accuracy is None else round(float(val_accuracy), 6),
            "val_loss": None if val_loss is None else round(float(val_loss), 6),
            "compression": compression or args.compression,
        }
    )


def log_epoch(log, epoch, epochs, metrics, seconds=None):
    """One progress line per epoch (call it on rank 0)."""
    took = f" ({seconds:.2f} s)" if seconds is not None else ""
    log.info(
        "epoch %d/%d: loss %.4f val_loss %.4f val_accuracy %.4f%s",
        epoch + 1,
        epochs,
        metrics["loss"],
        metrics["val_loss"],
        metrics["val_accuracy"],
        took,
    )


def run(train, doc, name, argv=None, add_flags=None):
    """An example's ``main``: its flags (described by the first line of ``doc``; ``add_flags(parser)`` adds its
    own), then ``train(args)``; an HvdkitError (bad input, a failed collective) becomes one line on stderr and
    exit code 2."""
    args = parse_args(doc.splitlines()[0], f"checkpoints/{name}", argv, add_flags)
    try:
        train(args)
    except HvdkitError as e:
        print(f"{name}: error: {e}", file=sys.stderr, flush=True)
        return 2
    return 0


def torch_datasets(seed):
    """The torch examples' training set ``(x, y, index)`` (the index feeds ``--sample-log``) and
    validation set ``(x, y)``."""
    import torch
    from torch.utils.data import TensorDataset

    x_train, y_train, x_val, y_val = load_split(seed)
    return (
        TensorDataset(torch.from_numpy(x_train), torch.from_numpy(y_train), torch.arange(len(y_train))),
        TensorDataset(torch.from_numpy(x_val), torch.from_numpy(y_val)),
    )


def torch_model():
    """The torch examples' model: 64 pixels -> 128 -> 64 -> 10 logits."""
    import torch

    return torch.nn.Sequential(
        torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10)
    )


def keras_model():
    """The Keras model of the Keras and TensorFlow examples: 64 pixels -> 128 -> 64 -> 10 logits."""
    import keras

    return keras.Sequential(
        [
            keras.Input((64,)),
            keras.layers.Dense(128, activation="relu"),
            keras.layers.Dense(64, activation="relu"),
            keras.layers.Dense(10),
        ]
    )

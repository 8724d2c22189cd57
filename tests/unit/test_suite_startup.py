"""The suite's start-up hook (tests/support/startup/sitecustomize.py): Keras starts without its optional
scikit-learn, pandas and matplotlib integrations in the suite's processes, and nothing else changes."""

import json
import os
import subprocess
import sys
from pathlib import Path

# What tests/conftest.py puts first on PYTHONPATH (pytest holds several modules named conftest: not imported)
STARTUP = str(Path(__file__).resolve().parents[1] / "support" / "startup")

_PROBE = """
import json, sys
import keras
imported = sorted(m for m in ("sklearn", "pandas", "matplotlib") if m in sys.modules)
from sklearn.utils import Bunch  # a script's own import of one of them still works
import pandas
print(json.dumps({"by_keras": imported, "own_import": [Bunch.__module__, pandas.DataFrame.__name__]}))
"""


def _probe(**env):
    procs = [
        subprocess.Popen([sys.executable, "-c", _PROBE], env={**os.environ, **e}, stdout=subprocess.PIPE, text=True)
        for e in env.values()
    ]  # both at once: each imports TensorFlow
    outs = [p.communicate(timeout=300)[0] for p in procs]
    assert [p.returncode for p in procs] == [0] * len(procs), outs
    return {k: json.loads(out.strip().splitlines()[-1]) for k, out in zip(env, outs, strict=True)}


def test_keras_leaves_out_sklearn_pandas_and_matplotlib_in_the_suites_processes_only():
    assert os.environ["PYTHONPATH"].split(os.pathsep)[0] == STARTUP  # what every started process inherits
    got = _probe(suite={}, stock={"HVDKIT_TEST_KERAS_EXTRAS": "1"})
    assert got["suite"] == {"by_keras": [], "own_import": ["sklearn.utils._bunch", "DataFrame"]}
    # Without the hook Keras imports all three (the cost the hook saves); if a Keras release stops
    # doing so, this fails and the hook can go.
    assert got["stock"]["by_keras"] == ["matplotlib", "pandas", "sklearn"]

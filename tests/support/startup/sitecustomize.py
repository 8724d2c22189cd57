"""Start-up of every Python process the test suite starts: Keras without its optional integrations.

Keras 3 imports scikit-learn (its ``keras.wrappers``), pandas (``fit``'s array slicing) and matplotlib
(``keras.visualization``) when they are installed, in every process that imports TensorFlow, whether
or not it uses them. The suite's venv has all three (scikit-learn ships the digits data, pandas comes
with Ray Tune, matplotlib draws the benchmark plots), and they cost each TensorFlow rank about 2.3 s of
CPU of its 6-8 s import on the 2-core machine (measured 2026-12-07; ``tests/unit/test_suite_startup.py``).
hvdkit uses none of them through Keras, and the suite starts a few hundred TensorFlow ranks, so here an
import of one of them *made by one of those Keras modules* fails as if the package were not installed,
which Keras handles (it leaves the integration out). Any other import of them (an example's
``sklearn.datasets``, the benchmark plots) is untouched.

``tests/conftest.py`` puts this folder first on ``PYTHONPATH``, so the pytest workers and every rank,
launcher and tool they start (hvdkit forwards ``PYTHONPATH`` to other hosts) run it. Users' processes
never do. ``HVDKIT_TEST_KERAS_EXTRAS=1`` keeps the integrations (to compare).
"""

import os
import sys

PACKAGES = frozenset({"sklearn", "pandas", "matplotlib"})
# The Keras modules that import them at import time (keras 3.x): keras/src/wrappers/{fixes,utils,
# sklearn_wrapper}.py, keras/src/trainers/data_adapters/array_slicing.py, keras/src/visualization/*.py.
IMPORTERS = ("keras.src.wrappers.", "keras.src.trainers.data_adapters.array_slicing", "keras.src.visualization.")
_MACHINERY = ("importlib", "_frozen_importlib", "_frozen_importlib_external", __name__)


def importer(frame) -> str:
    """The module whose code asked for an import: the first frame outside the import machinery."""
    while frame is not None:
        name = frame.f_globals.get("__name__", "")
        if not name.startswith(_MACHINERY):
            return name
        frame = frame.f_back
    return ""


class KerasWithoutExtras:
    """A meta-path finder that answers only for PACKAGES imported by IMPORTERS: not installed."""

    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] not in PACKAGES:
            return None
        if importer(sys._getframe(1)).startswith(IMPORTERS):
            raise ImportError(f"{name} is left out of Keras in hvdkit's test suite (tests/support/startup)", name=name)
        return None


if os.environ.get("HVDKIT_TEST_KERAS_EXTRAS") != "1":
    sys.meta_path.insert(0, KerasWithoutExtras())

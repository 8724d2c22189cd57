"""The digits examples read scikit-learn's bundled data file themselves (importing sklearn.datasets costs every
rank about 1.6 s); what they read must be exactly what scikit-learn's loader gives."""

import sys

import numpy as np
import pytest
from helpers import ROOT
from sklearn.datasets import load_digits  # at import: scikit-learn sets KMP_* variables when first imported

sys.path.insert(0, str(ROOT / "examples"))
import digits_common  # noqa: E402


def test_the_digits_read_from_the_bundled_file_are_bitwise_scikit_learns():
    x, y = digits_common.load_digits()
    ref_x, ref_y = load_digits(return_X_y=True)
    assert x.shape == (1797, 64) and x.dtype == ref_x.dtype and np.array_equal(x, ref_x)
    assert y.dtype == ref_y.dtype and np.array_equal(y, ref_y)


def test_without_the_bundled_file_the_digits_come_from_scikit_learns_loader(monkeypatch):
    class NoOrigin:
        origin = None

    monkeypatch.setattr(digits_common.importlib.util, "find_spec", lambda name: NoOrigin())
    x, y = digits_common.load_digits()
    ref_x, ref_y = load_digits(return_X_y=True)
    assert np.array_equal(x, ref_x) and np.array_equal(y, ref_y)


def test_reading_the_digits_imports_no_part_of_scikit_learn():
    import subprocess

    code = (
        "import sys; sys.path.insert(0, 'examples'); import digits_common; digits_common.load_split(0); "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('sklearn', 'scipy', 'pandas')))"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


@pytest.mark.parametrize("seed", [0, 3])
def test_the_split_is_the_same_permutation_of_the_same_data(seed):
    x_tr, y_tr, x_va, y_va = digits_common.load_split(seed)
    assert len(x_tr) == 1437 and len(x_va) == 360 and x_tr.dtype == np.float32 and y_tr.dtype == np.int64
    assert 0.0 <= x_tr.min() and x_tr.max() <= 1.0
    x, y = np.concatenate([x_tr, x_va]), np.concatenate([y_tr, y_va])
    order = np.random.RandomState(seed).permutation(1797)
    ref_x, ref_y = load_digits(return_X_y=True)
    assert np.array_equal(x, (ref_x[order] / 16.0).astype(np.float32)) and np.array_equal(y, ref_y[order])

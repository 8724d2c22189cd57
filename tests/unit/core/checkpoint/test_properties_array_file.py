"""Property tests of the checkpoint's array file: whatever arrays go in come back bitwise, by name."""

import hashlib
import tempfile
import zipfile
from pathlib import Path

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from hvdkit.core.checkpoint.arrays import ArrayFile, write_arrays

DTYPES = st.sampled_from(["float64", "float32", "float16", "int64", "int8", "uint8", "bool", "complex64"])
ORDERS = st.sampled_from(["C", "F", "strided"])


@st.composite
def arrays(draw):
    """Arrays of any rank (0-d too), empty ones, Fortran-ordered and non-contiguous views."""
    array = draw(hnp.arrays(DTYPES, hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=5)))
    order = draw(ORDERS)
    if order == "F":
        return np.asfortranarray(array)
    if order == "strided" and array.ndim:
        return np.repeat(array, 2, axis=0)[::2]  # the same values, a view that is not contiguous
    return array


@settings(max_examples=60, deadline=None)
@given(st.lists(arrays(), max_size=4))
def test_every_array_comes_back_bitwise_with_its_shape_dtype_and_name(items):
    named = [(f"tree/{i}", a) for i, a in enumerate(items)]
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "arrays.npz"
        digest = write_arrays(path, iter(named))
        assert digest == hashlib.sha256(path.read_bytes()).hexdigest()  # hashed while written, not read back
        assert zipfile.ZipFile(path).testzip() is None  # every member's CRC (after its data) is right
        f = ArrayFile(path)
        assert f.names() == [n for n, _ in named]
        for name, a in named:
            for got in (f.read(name), f.read(name, copy=True), np.load(path)[name]):
                assert (got.shape, got.dtype) == (a.shape, a.dtype), name
                assert np.ascontiguousarray(got).tobytes() == np.ascontiguousarray(a).tobytes(), name
            assert f.spec(name) == (a.shape, a.dtype)

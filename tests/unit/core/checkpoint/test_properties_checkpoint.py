"""Property-based tests (Hypothesis): the checkpoint manifest reader under random corruption.

One real checkpoint is written by ``CheckpointStore`` (two data files and the manifest); each
example copies it, corrupts the copy (bytes flipped, truncated, appended, files deleted or replaced
by a link or a folder, the manifest replaced by other JSON or by any text) and runs
``hvdkit.core.checkpoint.verify`` on it. The documented contract: it returns the manifest of an
intact checkpoint, else raises CheckpointError. So: never another exception, and never a
corrupted checkpoint accepted (whatever verify returns equals the original manifest, and every
file it lists is byte-identical to the original).
"""

import json
import os
import shutil
import tempfile

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from hvdkit.core import CheckpointError, LocalCommunicator
from hvdkit.core.checkpoint import MANIFEST, CheckpointStore, verify

FAST = settings(
    max_examples=150,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
FILES = ("state.bin", "extra.bin", MANIFEST)


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    """``(folder, {name: bytes}, manifest)`` of one complete checkpoint, written by the store."""
    store = CheckpointStore(str(tmp_path_factory.mktemp("ckpt")), LocalCommunicator(), keep=1)

    def write(folder):
        with open(os.path.join(folder, "state.bin"), "wb") as f:
            f.write(bytes(range(256)) * 3)
        with open(os.path.join(folder, "extra.bin"), "wb") as f:
            f.write(b'{"lr": 0.1}')

    path = store.save(write, step=40, epoch=2, meta={"note": "x"})
    store.close()
    contents = {}
    for name in FILES:
        with open(os.path.join(path, name), "rb") as f:
            contents[name] = f.read()
    return path, contents, verify(path)


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=8,
)


@st.composite
def manifest_edits(draw):
    """A manifest that is still JSON but differs: a field replaced by any JSON value (also inf, NaN)."""
    path = draw(
        st.sampled_from(
            [
                ("files",),
                ("step",),
                ("epoch",),
                ("world_size",),
                ("meta",),
                ("format",),
                ("files", "state.bin"),
                ("files", "state.bin", "size"),
                ("files", "state.bin", "sha256"),
                ("files", "extra.bin"),
            ]
        )
    )
    return ("edit", path, draw(JSON | st.sampled_from([float("inf"), float("-inf"), float("nan"), 10**30, -1, "40"])))


DATA = ("state.bin", "extra.bin")


def _byte_damage(names):
    return st.one_of(
        st.tuples(st.just("flip"), st.sampled_from(names), st.integers(0, 10**6), st.integers(1, 255)),
        st.tuples(st.just("truncate"), st.sampled_from(names), st.integers(0, 10**6)),
        st.tuples(st.just("append"), st.sampled_from(names), st.binary(min_size=1, max_size=8)),
        st.tuples(st.just("delete"), st.sampled_from(names)),
        st.tuples(st.just("replace"), st.sampled_from(["link", "folder"]), st.sampled_from(names)),
    )


DATA_CORRUPTIONS = _byte_damage(DATA)
MANIFEST_CORRUPTIONS = st.one_of(
    _byte_damage((MANIFEST,)),
    st.tuples(st.just("manifest-text"), st.text(max_size=40)),
    st.tuples(st.just("manifest-json"), JSON),
    manifest_edits(),
)


def _corrupt(folder, corruption, contents):
    kind, *args = corruption
    if kind in ("flip", "truncate", "append"):
        name = args[0]
        data = bytearray(contents[name])
        if kind == "flip":
            data[args[1] % len(data)] ^= args[2]
        elif kind == "truncate":
            del data[args[1] % len(data) :]
        else:
            data += args[1]
        with open(os.path.join(folder, name), "wb") as f:
            f.write(data)
    elif kind == "delete":
        os.unlink(os.path.join(folder, args[0]))
    elif kind == "replace":
        how, name = args
        target = os.path.join(folder, name)
        os.rename(target, target + ".orig")
        if how == "link":
            os.symlink(target + ".orig", target)  # same bytes, but through a link
        else:
            os.mkdir(target)
    elif kind == "manifest-text":
        with open(os.path.join(folder, MANIFEST), "w", encoding="utf-8") as f:
            f.write(args[0])
    else:
        if kind == "manifest-json":
            manifest = args[0]
        else:
            manifest = json.loads(contents[MANIFEST])
            *parents, last = args[0]
            node = manifest
            for key in parents:
                node = node[key]
            node[last] = args[1]
        with open(os.path.join(folder, MANIFEST), "w", encoding="utf-8") as f:
            json.dump(manifest, f)


def _check(pristine, corruption):
    """verify() on a corrupted copy: a CheckpointError naming it, or (harmless change) the original manifest."""
    path, contents, manifest = pristine
    with tempfile.TemporaryDirectory() as scratch:
        copy = os.path.join(scratch, os.path.basename(path))
        shutil.copytree(path, copy)
        _corrupt(copy, corruption, contents)
        try:
            accepted = verify(copy)
        except CheckpointError as e:
            assert copy in str(e)  # the message names the checkpoint
            return
        # Accepted: only when nothing that matters changed (e.g. whitespace in the manifest).
        assert accepted == manifest, f"{corruption} changed the manifest, and verify() accepted it"
        for name in manifest["files"]:
            with open(os.path.join(copy, name), "rb") as f:
                assert f.read() == contents[name], f"{corruption} changed {name}, and verify() accepted it"


@FAST
@given(DATA_CORRUPTIONS)
@example(("flip", "state.bin", 7, 1))
@example(("replace", "link", "extra.bin"))
def test_a_checkpoint_with_a_damaged_data_file_is_a_checkpoint_error(pristine, corruption):
    _check(pristine, corruption)


# Found by this test (before the manifest was sealed): {"files": null} or a list, an entry that is a
# number and "step": Infinity crashed verify(); an edited step, world_size or meta was accepted.
@FAST
@given(MANIFEST_CORRUPTIONS)
@example(("edit", ("step",), float("inf")))
@example(("edit", ("files",), [1, 2]))
@example(("edit", ("files", "state.bin"), 3))
@example(("edit", ("step",), 41))
def test_a_checkpoint_with_a_damaged_manifest_is_a_checkpoint_error_never_a_crash_nor_accepted(pristine, corruption):
    _check(pristine, corruption)


def test_the_pristine_checkpoint_verifies_and_a_copy_of_it_too(pristine, tmp_path):
    path, contents, manifest = pristine
    assert manifest["step"] == 40 and set(manifest["files"]) == {"state.bin", "extra.bin"}
    shutil.copytree(path, tmp_path / "copy")
    assert verify(str(tmp_path / "copy")) == manifest

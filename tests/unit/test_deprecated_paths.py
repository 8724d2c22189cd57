"""The module paths that moved in 0.2 still import for one release: warning, and as the module at
the new path itself (never a second copy with its own classes)."""

import json
import subprocess
import sys

import pytest
from helpers import ROOT

import hvdkit
from hvdkit import _deprecated
from hvdkit._deprecated import MOVED, new_path
from hvdkit.core import deprecation

PROBE = """
import importlib, json, sys, warnings
old = sys.argv[1]
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    module = importlib.import_module(old)
new = importlib.import_module(sys.argv[2])
same = module is new or all(getattr(module, n) is getattr(new, n) for n in getattr(new, "__all__", ()))
print(json.dumps({"same": same,
                  "warnings": [str(w.message) for w in caught if issubclass(w.category, DeprecationWarning)],
                  "copies": sorted(m for m in sys.modules if m.startswith(old + "."))}))
"""


def _exists(module):
    """Whether ``module`` is a file of the package, found without importing it (or its package: the
    adapters' import TensorFlow and torch, which set environment variables in this process)."""
    path = ROOT.joinpath(*module.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


@pytest.mark.parametrize("old", sorted(MOVED))
def test_an_old_module_path_imports_the_new_module_and_warns_naming_it(old):
    new = new_path(old)
    assert _exists(new), f"MOVED names {new}, which does not exist"
    if new.startswith(("hvdkit.keras", "hvdkit.torch")):
        pytest.skip("imports a framework; covered by the adapters' tests")
    out = subprocess.run([sys.executable, "-c", PROBE, old, new], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    got = json.loads(out.stdout)
    assert got["same"], f"{old} is a copy of {new}, not the module itself"
    assert f"{old} is deprecated and will be removed in hvdkit 0.3; use {new} instead" in got["warnings"]
    assert got["copies"] == [], "submodules loaded a second time under the old path"


def test_a_module_below_a_moved_package_moves_with_it_and_new_paths_are_left_alone():
    assert new_path("hvdkit.launch.plan") == "hvdkit.launcher.plan"
    assert new_path("hvdkit.launch.render") == "hvdkit.launcher.render.files"
    assert new_path("hvdkit.launcher.plan") is None and new_path("hvdkit.core.data") is None


def test_a_name_deprecated_before_its_module_moved_still_works_from_the_old_path():
    out = subprocess.run(
        [
            sys.executable,
            "-W",
            "ignore",
            "-c",
            "from hvdkit.core.tracking import Tracker, tracker_for; import hvdkit.core.monitoring.tracking as t; "
            "print(Tracker is t.Tracker, callable(tracker_for), hasattr(t, 'tracker_for'))",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.stdout.split() == ["True", "True", "False"], out.stderr[-2000:]


def _release(version):
    return tuple(int(part) for part in version.split(".")[:2])


def test_the_version_is_the_release_the_paths_moved_in_and_the_hook_says_so():
    assert _release(hvdkit.__version__) == _release(_deprecated.MOVED_IN) == (0, 2)
    assert _release(hvdkit.__version__) < _release(_deprecated.REMOVED_IN)
    assert _deprecated.REMOVED_IN == deprecation.REMOVED_IN  # the old names and the old paths go together
    assert f"moved in hvdkit {_deprecated.MOVED_IN}," in _deprecated.__doc__
    assert f"removed in {_deprecated.REMOVED_IN}" in _deprecated.__doc__

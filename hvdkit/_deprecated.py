"""Module paths that moved in hvdkit 0.2, kept for one release (removed in 0.3 with the old names).

``import hvdkit.core.tracking`` or ``from hvdkit.launch.render import RenderSpec`` still work and
warn (DeprecationWarning) naming the new path: a finder on ``sys.meta_path`` (installed by
``import hvdkit``) answers an old path with the module at its new one. An old module's names that
were deprecated before the move (``hvdkit.core.tracking.tracker_for``) come from its package's
``_deprecated`` module. Nothing here imports a framework or a moved module until asked.
"""

import importlib
import importlib.abc
import importlib.util
import sys
import types
import warnings

__all__ = ["MOVED", "new_path", "install"]

MOVED_IN = "0.2"  # the release these paths moved in: hvdkit.__version__ is a 0.2 release
REMOVED_IN = "0.3"

# old module -> new module (a package prefix: every module below it moved alike)
MOVED = {
    "hvdkit.core.checkpointer": "hvdkit.core.checkpoint.state",
    "hvdkit.core.checkpoint_folder": "hvdkit.core.checkpoint.folder",
    "hvdkit.core.checkpoint_lock": "hvdkit.core.checkpoint.lock",
    "hvdkit.core.checkpoint_arrays": "hvdkit.core.checkpoint.arrays",
    "hvdkit.core.checkpoint_tree": "hvdkit.core.checkpoint.tree",
    "hvdkit.core.manifest": "hvdkit.core.checkpoint.manifest",
    "hvdkit.core.plain_data": "hvdkit.core.checkpoint.plain_data",
    "hvdkit.core.straggler": "hvdkit.core.monitoring.straggler",
    "hvdkit.core.progress": "hvdkit.core.monitoring.progress",
    "hvdkit.core.tracking": "hvdkit.core.monitoring.tracking",
    "hvdkit.core.tensorboard_events": "hvdkit.core.monitoring.tensorboard_events",
    "hvdkit.core.mlflow_store": "hvdkit.core.monitoring.mlflow_store",
    "hvdkit.core.tfrecord": "hvdkit.core.monitoring.tfrecord",
    "hvdkit.core.sample_order": "hvdkit.core.data",
    "hvdkit.core.global_batch": "hvdkit.core.data",
    "hvdkit.launch.elastic": "hvdkit.launcher.elastic.rules",
    "hvdkit.launch.elastic_run": "hvdkit.launcher.elastic.loop",
    "hvdkit.launch.discovery": "hvdkit.launcher.elastic.discovery",
    "hvdkit.launch.render": "hvdkit.launcher.render.files",
    "hvdkit.launch.render_spec": "hvdkit.launcher.render.spec",
    "hvdkit.launch.doctor": "hvdkit.diagnostics.doctor",
    "hvdkit.launch.doctor_gpu": "hvdkit.diagnostics.doctor_gpu",
    "hvdkit.launch.timeline": "hvdkit.diagnostics.timeline",
    "hvdkit.launch.timeline_plot": "hvdkit.diagnostics.timeline_plot",
    "hvdkit.launch": "hvdkit.launcher",
    "hvdkit.keras.deprecated": "hvdkit.keras._deprecated",
}
# old module -> the module holding its names deprecated before the move
_OLD_NAMES = {"hvdkit.core.tracking": "hvdkit.core._deprecated"}


def new_path(old):
    """The module that ``old`` moved to, or None when it did not move."""
    if old in MOVED:
        return MOVED[old]
    package = old.rpartition(".")[0]
    while package:
        if package in MOVED:
            return MOVED[package] + old[len(package) :]
        package = package.rpartition(".")[0]
    return None


class _Alias(importlib.abc.Loader):
    def __init__(self, new):
        self.new = new

    def create_module(self, spec):
        target = importlib.import_module(self.new)
        if spec.name not in _OLD_NAMES:
            return target
        alias = types.ModuleType(spec.name, target.__doc__)
        extra = _OLD_NAMES[spec.name]

        def lookup(name):
            if hasattr(target, name):
                return getattr(target, name)
            return getattr(importlib.import_module(extra), name)

        alias.__getattr__ = lookup
        return alias

    def exec_module(self, module):
        pass


class _MovedModules(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        new = new_path(name)
        if new is None or importlib.util.find_spec(new) is None:
            return None
        warnings.warn(
            f"{name} is deprecated and will be removed in hvdkit {REMOVED_IN}; use {new} instead",
            DeprecationWarning,
            stacklevel=2,
        )
        return importlib.util.spec_from_loader(name, _Alias(new))


def install():
    """Answer the old module paths (once per process)."""
    if not any(isinstance(f, _MovedModules) for f in sys.meta_path):
        sys.meta_path.insert(0, _MovedModules())  # before the path finder, which would load a second copy

"""Every public function of the typed packages carries parameter and return annotations.

Public: a name in a module's ``__all__`` (a function, or a class and its public methods,
properties and ``__init__``), for every module of the packages in ``TYPED_PACKAGES``. A name a
module re-exports from outside those packages is checked where it is defined, if at all.
"""

import importlib
import inspect
import pkgutil

import pytest

TYPED_PACKAGES = (
    "hvdkit.core",
    "hvdkit.torch",
    "hvdkit.tensorflow",
    "hvdkit.keras",
    "hvdkit.engine",
    "hvdkit.diagnostics",
    "hvdkit.launcher",
    "hvdkit.cli",
    "hvdkit.bench",  # its workers import torch/TensorFlow only when run, so every module imports here
)
# Packages whose annotations are not complete yet: their test is an expected failure (strict, so it
# fails once they are done and the entry must go). ``pytest -rx`` lists what each still lacks.
PENDING = ()
# Not Python modules of the package: the engine recipe runs in the target environment, not hvdkit's.
SKIPPED_MODULES = ("hvdkit.engine.recipe",)


def _in_scope(module_name):
    return (
        module_name.startswith(tuple(p + "." for p in TYPED_PACKAGES) + TYPED_PACKAGES)
        and not module_name.startswith(SKIPPED_MODULES)
        and not module_name.endswith(".__main__")  # importing one runs the program (render rewrites launch/)
    )


def modules():
    """Every importable module of ``TYPED_PACKAGES``, by name."""
    names = []
    for package in TYPED_PACKAGES:
        names.append(package)
        for info in pkgutil.walk_packages(importlib.import_module(package).__path__, package + "."):
            if _in_scope(info.name):
                names.append(info.name)
    return names


def _functions(name, obj):
    """``[(qualified name, function)]`` that ``obj`` (a name of some ``__all__``) makes public."""
    if inspect.ismethod(obj):  # a bound method exported as a function (the runtimes' init, rank, ...)
        obj = obj.__func__
    if inspect.isfunction(obj):
        return [(f"{obj.__module__}.{obj.__qualname__}", obj)]
    if not inspect.isclass(obj):
        return []
    found = []
    for attr, member in vars(obj).items():
        if attr.startswith("_") and attr != "__init__":
            continue
        if isinstance(member, (staticmethod, classmethod)):
            member = member.__func__
        if isinstance(member, property):
            member = member.fget
        if inspect.isfunction(member):
            found.append((f"{obj.__module__}.{obj.__qualname__}.{attr}", member))
    return found


def missing_annotations(function):
    """The names of ``function``'s parameters without an annotation, and ``return`` if it has none."""
    annotations = function.__annotations__
    params = [p for p in inspect.signature(function).parameters.values() if p.name not in ("self", "cls")]
    missing = [p.name for p in params if p.name not in annotations]
    return missing + ([] if "return" in annotations else ["return"])


def public_functions():
    """``{qualified name: function}`` of every public function defined in ``TYPED_PACKAGES``."""
    found = {}
    for module_name in modules():
        module = importlib.import_module(module_name)
        for name in getattr(module, "__all__", ()):
            for qualname, function in _functions(name, getattr(module, name)):
                if _in_scope(function.__module__):
                    found[qualname] = function
    return found


# Walked once, at collection: importing the adapters sets TensorFlow's and Horovod's environment
# variables, which the suite's leak check would blame on whichever test imported them first.
PUBLIC = public_functions()


def test_the_walk_finds_the_public_functions():
    found = PUBLIC
    assert "hvdkit.core.lr.scaled_lr" in found
    assert "hvdkit.core.comm.Communicator.allreduce_sum" in found
    assert "hvdkit.core.checkpoint.store.CheckpointStore.__init__" in found


def test_missing_annotations_names_each_unannotated_parameter_and_the_return():
    def half(a: int, b, *args, c=1, **kwargs) -> int: ...

    def whole(a: int) -> int: ...

    assert missing_annotations(half) == ["b", "args", "c", "kwargs"]
    assert missing_annotations(lambda x: x) == ["x", "return"]
    assert missing_annotations(whole) == []


@pytest.mark.parametrize(
    "package",
    [
        pytest.param(p, marks=pytest.mark.xfail(strict=True, reason="annotations pending")) if p in PENDING else p
        for p in TYPED_PACKAGES
    ],
)
def test_public_functions_are_fully_annotated(package):
    incomplete = [
        f"{qualname}: {', '.join(missing)}"
        for qualname, function in sorted(PUBLIC.items())
        if qualname.startswith(package + ".") and (missing := missing_annotations(function))
    ]
    assert incomplete == [], "public functions without complete type hints:\n" + "\n".join(incomplete)

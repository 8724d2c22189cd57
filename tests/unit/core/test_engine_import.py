"""The adapters' lazy engine import: a missing framework or Horovod support is named with the fix."""

import pytest

from hvdkit.core.engine_import import import_engine
from hvdkit.core.errors import MissingDependencyError


def test_a_missing_framework_is_named_with_the_adapter_and_the_fix():
    with pytest.raises(
        MissingDependencyError,
        match=r"^hvdkit\.nothing needs NoFramework \(No module named 'no_such_framework'\); run `make setup`",
    ):
        import_engine("no_such_framework", "NoFramework", "horovod.nothing", "hvdkit.nothing")


def test_horovod_without_support_for_an_installed_framework_says_it_must_be_built_against_it():
    # json stands for an installed framework; Horovod has no "json" support module
    with pytest.raises(
        MissingDependencyError,
        match=r"Horovod with JSON support is not importable .*built against the installed JSON: run `make setup`",
    ):
        import_engine("json", "JSON", "horovod.no_such_support", "hvdkit.json")


def test_the_horovod_module_is_returned_when_both_import():
    import importlib

    assert import_engine("json", "JSON", "json.decoder", "hvdkit.json") is importlib.import_module("json.decoder")

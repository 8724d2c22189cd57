"""Fixtures shared by every test."""

import os

import pytest


@pytest.fixture(autouse=True)
def _no_leaked_env():
    """Fail a test that leaves an environment variable changed (as Lightning's conftest does)."""
    before = dict(os.environ)
    yield
    after = dict(os.environ)
    changed = {k for k in before.keys() | after.keys() if before.get(k) != after.get(k)} - {"PYTEST_CURRENT_TEST"}
    assert not changed, f"test leaked environment changes: {sorted(changed)}"

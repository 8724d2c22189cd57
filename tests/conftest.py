"""Fixtures shared by every test."""

import os

import pytest

# MLflow 3 starts a usage-telemetry thread on import that sets, and later may unset,
# _MLFLOW_TELEMETRY_SESSION_ID at a moment of its choosing (a spurious "leak" below), and tries to
# reach the internet. Off for the whole test session and the ranks it starts.
os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")


@pytest.fixture(autouse=True)
def _no_leaked_env():
    """Fail a test that leaves an environment variable changed (as Lightning's conftest does)."""
    before = dict(os.environ)
    yield
    after = dict(os.environ)
    changed = {k for k in before.keys() | after.keys() if before.get(k) != after.get(k)} - {"PYTEST_CURRENT_TEST"}
    assert not changed, f"test leaked environment changes: {sorted(changed)}"

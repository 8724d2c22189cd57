"""A pytest plugin (``-p reached_files``) for tests/unit/test_suite_layout.py: prints each test file that pytest's
collection reaches, as ``reached <path>``, and imports none of them.

The folders are walked by pytest's own rules (``norecursedirs``: "build", "dist", dot folders...), so a file a
renamed folder hides is missing here as it would be from the run; the files themselves are not imported (that
would import torch, TensorFlow and the rest: 35-55 s of a core).
"""

import pytest


@pytest.hookimpl(tryfirst=True)
def pytest_ignore_collect(collection_path, config):
    if collection_path.is_file() and collection_path.name.startswith("test_") and collection_path.suffix == ".py":
        print(f"reached {collection_path.relative_to(config.rootpath)}")
        return True  # reached, not imported
    return None  # a folder: pytest's own rules decide

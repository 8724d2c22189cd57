"""The writer of docs/benchmarks.md's results sections: each between its own pair of markers.

The page keeps its prose by hand; ``make bench``, ``make bench-network`` and ``make bench-predict``
replace only the text between ``<!-- bench:NAME:begin -->`` and ``<!-- bench:NAME:end -->``.
"""

import os

from hvdkit.core.errors import ConfigError

__all__ = ["RESULTS", "NETWORK", "MODEL", "markers", "check_page", "replace_section", "write_results"]


def markers(name):
    """The (begin, end) markers of section ``name``."""
    return f"<!-- bench:{name}:begin -->", f"<!-- bench:{name}:end -->"


RESULTS, NETWORK, MODEL = markers("results"), markers("network"), markers("model")


def check_page(path, section):
    """Raise ConfigError unless ``path`` is a file holding both markers of ``section``: before a long run."""
    if not os.path.isfile(path):
        raise ConfigError(f"--docs {path!r} is not a file; pass the Markdown file to update (docs/benchmarks.md)")
    with open(path, encoding="utf-8") as f:
        text = f.read()
    begin, end = section
    if begin not in text or end not in text:
        raise ConfigError(f"{path} has no {begin} ... {end} markers; add them where the results should go")


def replace_section(path, text, section):
    """Replace what lies between ``section``'s markers in ``path`` with ``text``."""
    check_page(path, section)
    begin, end = section
    with open(path, encoding="utf-8") as f:
        page = f.read()
    head, rest = page.split(begin, 1)
    _, tail = rest.split(end, 1)
    with open(path, "w", encoding="utf-8") as f:
        f.write(f"{head}{begin}\n{text}\n{end}{tail}")


def write_results(path, section, markdown, results, plots):
    """``markdown(results, plots, docs_dir)`` into ``section`` of ``path``, the plots linked from the page's folder."""
    replace_section(path, markdown(results, plots, docs_dir=os.path.dirname(path) or "."), section)

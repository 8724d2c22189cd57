"""The project's benchmark lab (benchmarks/, not installed): its docs writer, its commands, and how
its processes find it; ``hvdkit bench`` keeps only the user's own flags."""

import os
import subprocess
import sys

import pytest
from helpers import ROOT

from benchmarks import docs, env_with_root
from hvdkit.cli.bench import parser as bench_parser
from hvdkit.core.errors import ConfigError


def test_a_section_is_replaced_between_its_markers_and_the_rest_of_the_page_kept(tmp_path):
    begin, end = docs.RESULTS
    page = tmp_path / "benchmarks.md"
    page.write_text(f"# Title\nintro\n{begin}\nold table\n{end}\nafter\n")
    docs.replace_section(str(page), "new table", docs.RESULTS)
    assert page.read_text() == f"# Title\nintro\n{begin}\nnew table\n{end}\nafter\n"


def test_a_page_without_the_markers_or_no_page_at_all_is_an_error_naming_what_is_missing(tmp_path):
    bare = tmp_path / "bare.md"
    bare.write_text("no markers")
    with pytest.raises(ConfigError, match="bench:network:begin"):
        docs.replace_section(str(bare), "x", docs.NETWORK)
    assert bare.read_text() == "no markers"
    with pytest.raises(ConfigError, match="is not a file"):
        docs.check_page(str(tmp_path / "missing.md"), docs.MODEL)


def test_results_link_their_plots_from_the_pages_folder(tmp_path, monkeypatch):
    def markdown(results, plots, docs_dir):
        return f"{results['n']}: " + " ".join(os.path.relpath(p, docs_dir) for p in plots)

    (tmp_path / "docs").mkdir()
    page = tmp_path / "docs" / "benchmarks.md"
    page.write_text("<!-- bench:model:begin -->\n<!-- bench:model:end -->\n")
    docs.write_results(str(page), docs.MODEL, markdown, {"n": 1}, [str(tmp_path / "docs" / "bench" / "a.png")])
    assert "1: bench/a.png\n" in page.read_text()
    monkeypatch.chdir(tmp_path / "docs")  # a page named without a folder: links from the working directory
    docs.write_results("benchmarks.md", docs.MODEL, markdown, {"n": 2}, ["bench/a.png"])
    assert "2: bench/a.png\n" in page.read_text()


def _lab(*argv, cwd=ROOT, env=None):
    return subprocess.run([sys.executable, "-m", *argv], cwd=cwd, env=env, capture_output=True, text=True, timeout=120)


def test_the_lab_lists_its_commands_and_each_has_its_help():
    listing = _lab("benchmarks", "--help")
    assert listing.returncode == 0 and all(c in listing.stdout for c in ("suite", "network", "predict"))
    for command, flag in (("suite", "--docs"), ("network", "--link"), ("predict", "--zero"), ("zero", "--out")):
        helped = _lab("benchmarks", command, "--help")
        assert helped.returncode == 0 and flag in helped.stdout, helped.stderr
    unknown = _lab("benchmarks", "bogus")
    assert unknown.returncode == 2 and "unknown command 'bogus'" in unknown.stderr


def test_a_lab_process_started_elsewhere_finds_the_package_through_env_with_root(tmp_path):
    bare = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    assert _lab("benchmarks.tcp_stream", "--help", cwd=tmp_path, env=bare).returncode != 0  # not installed
    found = _lab("benchmarks.tcp_stream", "--help", cwd=tmp_path, env=env_with_root(bare))
    assert found.returncode == 0 and "recv" in found.stdout


def test_hvdkit_bench_has_only_the_users_own_flags():
    text = bench_parser().format_help()
    assert all(f in text for f in ("--out", "--num-proc", "--quick", "--no-tune"))
    assert not any(f in text for f in ("--docs", "--hosts", "--link", "--predict"))

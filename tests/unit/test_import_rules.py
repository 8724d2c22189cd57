"""The layers of docs/architecture.md hold: every import statement of every hvdkit module (also
those inside functions) is allowed by the table in that page, which this test reads."""

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "hvdkit"
DOC = ROOT / "docs" / "architecture.md"
FRAMEWORKS = ("torch", "tensorflow", "keras", "horovod", "mpi4py")


def rules():
    """{layer: (allowed hvdkit layers or None for any, allowed frameworks or None for any)} from the doc's table."""
    table = {}
    for line in DOC.read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 4 or not cells[0].startswith("`hvdkit"):
            continue
        layer = cells[0].strip("`")
        own = None if cells[2] == "any" else set(re.findall(r"`([\w.]+)`", cells[2]))
        frameworks = (
            None if cells[3] == "any" else set() if cells[3] == "none" else {f.strip() for f in cells[3].split(",")}
        )
        table[layer] = (own, frameworks)
    return table


def layer_of(module):
    """The layer ``module`` belongs to: ``hvdkit.X``, or a deeper folder the doc's table names itself."""
    parts = module.split(".")
    if len(parts) > 3 and ".".join(parts[:3]) in rules():
        return ".".join(parts[:3])
    return ".".join(parts[:2]) if len(parts) > 1 else parts[0]


def module_name(path):
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts), path.name == "__init__.py"


def imports(path):
    """Every module name an import statement in ``path`` names, relative imports resolved."""
    name, is_package = module_name(path)
    package = name if is_package else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            module = node.module
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            for alias in node.names:  # "from .. import tensorflow" imports a module, not a name
                yield f"{module}.{alias.name}" if is_module(f"{module}.{alias.name}") else module


def is_module(name):
    path = ROOT.joinpath(*name.split("."))
    return path.is_dir() or path.with_suffix(".py").is_file()


def violations(path, table):
    name, _ = module_name(path)
    own, frameworks = table[layer_of(name)]
    found = []
    for target in imports(path):
        top = target.split(".")[0]
        if top == "hvdkit":
            if own is not None and layer_of(target) not in own:
                found.append(target)
        elif top in FRAMEWORKS and frameworks is not None and top not in frameworks:
            found.append(target)
    return found


MODULES = sorted(p for p in PACKAGE.rglob("*.py") if "__pycache__" not in p.parts)
# The project's own benchmark lab: not installed, may import any of hvdkit, never imported by it.
LAB = sorted(p for p in (ROOT / "benchmarks").rglob("*.py") if "__pycache__" not in p.parts)


def test_the_doc_table_names_every_layer_of_the_package():
    table = rules()
    layers = {layer_of(module_name(p)[0]) for p in MODULES} - {"hvdkit", "hvdkit.__main__"}
    assert layers <= set(table), f"layers missing from docs/architecture.md: {sorted(layers - set(table))}"
    assert table["hvdkit.core"] == ({"hvdkit", "hvdkit.core"}, set())
    assert table["hvdkit.keras"][0] == {"hvdkit.core", "hvdkit.tensorflow", "hvdkit.keras"}


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_module_imports_only_what_its_layer_may(path):
    table = rules()
    if layer_of(module_name(path)[0]) not in table:  # hvdkit/__init__.py and __main__.py: the entry points
        return
    assert violations(path, table) == [], f"{path.relative_to(ROOT)} breaks docs/architecture.md's import rules"


def test_the_checker_catches_a_core_module_importing_torch_lazily_or_an_adapter_importing_another(
    tmp_path, monkeypatch
):
    table = rules()
    bad_core = PACKAGE / "core" / "_probe_bad.py"
    bad_torch = PACKAGE / "torch" / "_probe_bad.py"
    fake = {
        bad_core: "def f():\n    import torch\n    from ..launcher import plan\n",
        bad_torch: "from ..keras import callbacks\nfrom .. import tensorflow\n",
    }
    monkeypatch.setattr(Path, "read_text", lambda self, *a, **k: fake[self] if self in fake else Path.open(self).read())
    assert violations(bad_core, table) == ["torch", "hvdkit.launcher.plan"]  # also inside a function
    assert violations(bad_torch, table) == ["hvdkit.keras.callbacks", "hvdkit.tensorflow"]


def module_graph(paths):
    """``{module: {hvdkit modules it imports}}``, imports inside functions included; a package's
    ``__init__`` counts as the package, and an import of a package counts as one of its ``__init__``."""
    names = {module_name(p)[0] for p in paths}
    graph = {}
    for path in paths:
        name = module_name(path)[0]
        graph[name] = {t for t in imports(path) if t in names and t != name}
    return graph


def cycles(graph):
    """Every import circle of ``graph``, each as the list of its modules (Tarjan's strongly connected components)."""
    index, low, stack, on_stack, found, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_import_circles_not_even_inside_functions():
    """Two modules that import each other (one of them lazily, to dodge the import-time error) are
    one concept split in two, or a shared piece that belongs in a third module."""
    # a package's __init__ re-exporting its modules is not a circle: only module-to-module edges
    leaves = [p for p in MODULES + LAB if p.name != "__init__.py"]
    assert cycles(module_graph(leaves)) == []


def test_the_installed_package_never_imports_the_benchmark_lab():
    assert LAB, "benchmarks/ moved: update LAB"
    found = {str(p.relative_to(ROOT)): t for p in MODULES for t in imports(p) if t.split(".")[0] == "benchmarks"}
    assert found == {}, "hvdkit is installed without benchmarks/: an import of it fails outside the checkout"


def test_the_circle_finder_finds_a_lazy_circle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


# docs/architecture.md, "Flags and processes": the files allowed to define flags or start processes, named
# one by one, so that a new one is a decision made here and in the page, not a habit.
FLAG_FILES = {
    # the command's own flags: one module per sub-command
    *(f"hvdkit/cli/{p.name}" for p in (PACKAGE / "cli").glob("*.py")),
    # the workers' own command lines (`python -m hvdkit.bench.X`, each in its `if __name__ == "__main__"`)
    "hvdkit/bench/breakdown.py",
    "hvdkit/bench/ckpt_bench.py",
    "hvdkit/bench/comm_bench.py",
    "hvdkit/bench/keras_bench.py",
    "hvdkit/bench/step_sweep.py",
    "hvdkit/bench/train_bench.py",
    "hvdkit/bench/zero_bench.py",
    "hvdkit/engine/recipe/engine_plan.py",  # the recipe's script, run by the target environment's python
}
POPEN_FILES = {
    "hvdkit/launcher/execute.py",  # a job's launcher (mpirun / horovodrun)
    "hvdkit/launcher/child.py",  # every other command run to its end: tune trials, benchmark jobs, doctor
    "hvdkit/launcher/rankwrap.py",  # each rank's wrapper starts the rank
    "hvdkit/launcher/elastic/discovery.py",  # the host discovery script, its own group ended on a timeout
    "hvdkit/engine/__init__.py",  # the engine build: the engine is below the launcher, it cannot import it
}
_FLAG_CALLS = {"ArgumentParser", "add_argument", "add_parser", "add_argument_group", "add_mutually_exclusive_group"}


def _calls(tree, names):
    """The names in ``names`` that ``tree`` calls (``f(...)`` or ``x.f(...)``) or imports by name."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
            if name in names:
                found.add(name)
        elif isinstance(node, ast.ImportFrom):
            found |= {a.name for a in node.names if a.name in names}
    return found


def _has_main_block(tree):
    return any(
        isinstance(node, ast.If) and "__main__" in ast.unparse(node.test) and "__name__" in ast.unparse(node.test)
        for node in tree.body
    )


def files_calling(names, paths=MODULES):
    """``{path relative to the repository: names called}`` of every module of ``paths`` calling one of ``names``."""
    found = {}
    for path in paths:
        called = _calls(ast.parse(path.read_text(), str(path)), names)
        if called:
            found[str(path.relative_to(ROOT))] = called
    return found


def test_flags_are_defined_only_by_the_cli_and_the_workers_own_command_lines():
    defining = set(files_calling(_FLAG_CALLS))
    assert defining - FLAG_FILES == set(), "flags belong in hvdkit/cli/ (docs/architecture.md: Flags and processes)"
    workers = {f for f in FLAG_FILES if not f.startswith("hvdkit/cli/")}
    assert workers <= defining, "a worker named in FLAG_FILES defines no flags any more: take it off the list"
    for rel in workers:
        assert _has_main_block(ast.parse((ROOT / rel).read_text())), f"{rel} defines flags but is no program"


def test_processes_are_started_only_by_the_launchers_execution_and_child_helper():
    starting = set(files_calling({"Popen"}))
    assert starting == POPEN_FILES, "start a command with hvdkit.launcher.child (docs/architecture.md)"
    page = DOC.read_text()
    assert all(f"`{rel.removeprefix('hvdkit/')}`" in page for rel in POPEN_FILES), "name each one in the page"


def test_the_flag_and_process_checker_catches_a_parser_and_a_popen_outside_their_homes(tmp_path):
    (tmp_path / "worker.py").write_text("import argparse\np = argparse.ArgumentParser()\np.add_argument('-x')\n")
    (tmp_path / "runner.py").write_text("from subprocess import Popen\nimport subprocess\nsubprocess.Popen(['true'])\n")
    (tmp_path / "fine.py").write_text("import subprocess\nsubprocess.run(['true'])\nparse = None\n")
    trees = {p.name: ast.parse(p.read_text()) for p in tmp_path.iterdir()}
    assert _calls(trees["worker.py"], _FLAG_CALLS) == {"ArgumentParser", "add_argument"}
    assert _calls(trees["runner.py"], {"Popen"}) == {"Popen"}
    assert _calls(trees["fine.py"], _FLAG_CALLS | {"Popen"}) == set()
    assert not _has_main_block(trees["worker.py"])
    assert _has_main_block(ast.parse("if __name__ == '__main__':\n    main()\n"))


def layer_arrows():
    """``{(importer, imported)}`` between layers, by short name (``bench``), core and the entry points left out."""
    table, arrows = rules(), set()
    for path in MODULES:
        source = layer_of(module_name(path)[0])
        for target in (t for t in imports(path) if t.split(".")[0] == "hvdkit"):
            layer = layer_of(target)
            if layer != source and source in table and layer in table and layer != "hvdkit.core":
                arrows.add((source.removeprefix("hvdkit."), layer.removeprefix("hvdkit.")))
    return arrows


def page_arrows(text):
    """The arrows the page's "Arrows (...)" paragraph lists: ``cli`` -> ``bench``, ``tune``; ..."""
    paragraph = " ".join(text.split("\nArrows (", 1)[1].split("\n\n", 1)[0].split())
    found = set()
    for source, targets in re.findall(r"`([\w.]+)` -> ((?:`[\w.]+`(?:, )?)+)", paragraph):
        found |= {(source, t) for t in re.findall(r"`([\w.]+)`", targets)}
    return found


def test_the_diagrams_arrows_are_the_imports_between_layers():
    assert page_arrows(DOC.read_text()) == layer_arrows()
    assert page_arrows("x\nArrows (a): `a` -> `b`, `c`; `d` -> `e`.\n\nnext") == {("a", "b"), ("a", "c"), ("d", "e")}


def test_the_page_and_the_cores_docstring_name_every_core_module_in_its_four_groups():
    core = PACKAGE / "core"
    names = {p.stem for p in core.glob("*.py") if p.stem not in ("__init__", "_deprecated")}
    names |= {p.name for p in core.iterdir() if (p / "__init__.py").is_file()}
    section = DOC.read_text().split("## The core in four groups", 1)[1].split("\n## ", 1)[0]
    docstring = ast.get_docstring(ast.parse((core / "__init__.py").read_text()))
    for text in (section, docstring):
        assert all(g in text for g in ("Ground", "The rank's process", "Training arithmetic", "Channels"))
        named = set(re.findall(r"`+(\w+)/?`+", text))
        assert names - named == set(), "a core module in no group"

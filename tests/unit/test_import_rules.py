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

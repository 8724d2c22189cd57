"""Write docs/api/*.md, the API reference, from the public names (``__all__``) and their docstrings.

    .venv/bin/python scripts/gen_api_docs.py          # rewrite docs/api/
    .venv/bin/python scripts/gen_api_docs.py --check  # exit 1 if docs/api/ is out of date (a test runs this)

The reference is generated so that it cannot drift from the code: a docstring is the one place an
API is described.
"""

import argparse
import importlib
import inspect
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
PAGES = {
    "torch.md": ("hvdkit.torch", "PyTorch: `import hvdkit.torch as hk`"),
    "keras.md": ("hvdkit.keras", "Keras 3 (`model.fit`): `import hvdkit.keras as hk`"),
    "tensorflow.md": ("hvdkit.tensorflow", "TensorFlow custom loops: `import hvdkit.tensorflow as htf`"),
    "core.md": ("hvdkit.core", "Framework-free core: `import hvdkit.core`"),
    "tune.md": ("hvdkit.tune", "Hyperparameter search (`hvdkit tune`): `import hvdkit.tune`"),
    "torch-elastic.md": ("hvdkit.torch.elastic", "In-process recovery (`--recovery in-process`): `hk.elastic`"),
    "keras-elastic.md": ("hvdkit.keras.elastic", "In-process recovery for Keras: `hk.elastic`"),
}


class _Annotation(str):
    """An annotation kept as text (``from __future__ import annotations``), shown without quotes."""

    def __repr__(self):
        return str(self)


def _signature(obj):
    try:
        sig = inspect.signature(obj)
    except (TypeError, ValueError):
        return "(...)"
    params = [
        p.replace(annotation=_Annotation(p.annotation)) if isinstance(p.annotation, str) else p
        for p in sig.parameters.values()
    ]
    ret = sig.return_annotation
    return str(sig.replace(parameters=params, return_annotation=_Annotation(ret) if isinstance(ret, str) else ret))


def _kind(obj):
    if inspect.isclass(obj):
        return "class"
    if callable(obj):
        return "function"
    return "value"


def _entry(module, name):
    obj = getattr(module, name)
    doc = inspect.getdoc(obj) or ""
    if not (inspect.isclass(obj) or callable(obj)):
        return [f"### `{name}`", "", f"`{obj!r}`", ""]
    lines = [f"### `{name}{_signature(obj)}`", "", f"*{_kind(obj)}*", "", doc or "(no docstring)", ""]
    if inspect.isclass(obj):
        members = {}  # the class's own methods and those it inherits from hvdkit's classes (not Keras's, torch's)
        for cls in reversed([c for c in obj.__mro__ if c.__module__.startswith("hvdkit.")]):
            members.update(vars(cls))
        for attr, member in sorted(members.items()):
            own = getattr(member, "__doc__", None)  # not an inherited one (Keras' on_* hooks)
            if attr.startswith(("_", "on_")) or not callable(member) or not own:
                continue
            lines += [f"- **`{attr}{_signature(member)}`**: " + inspect.cleandoc(own).replace("\n", "\n  "), ""]
    return lines


def page(module_name, title):
    module = importlib.import_module(module_name)
    names = sorted(getattr(module, "__all__", []), key=str.lower)
    lines = [f"# {title}", "", "Generated from the docstrings by `scripts/gen_api_docs.py`; do not edit by hand.", ""]
    lines += [inspect.getdoc(module) or "", "", "Names: " + ", ".join(f"`{n}`" for n in names), ""]
    for name in names:
        lines += _entry(module, name)
    return "\n".join(lines).rstrip() + "\n"


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--check", action="store_true", help="compare instead of writing; exit 1 on a difference")
    args = p.parse_args(argv)
    out = ROOT / "docs" / "api"
    stale = []
    for fname, (module_name, title) in PAGES.items():
        text = page(module_name, title)
        path = out / fname
        if args.check:
            if not path.exists() or path.read_text(encoding="utf-8") != text:
                stale.append(str(path.relative_to(ROOT)))
        else:
            out.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")
    if stale:
        print(f"out of date: {', '.join(stale)}; regenerate: make docs", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

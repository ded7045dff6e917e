"""The package's layers, written down and enforced over every module's imports (``ast``).

Each package may import only from the packages listed for it (and from itself): imports run downward, from
the command line to the ground. A change that crosses a layer fails here with the file, the import and the
rule. Modules are also never imported only for their side effects, and the modules form no cycle.
"""

from __future__ import annotations

import ast
import pathlib

import pytest

from tests.support import ROOT

PACKAGE = ROOT / "pyrobnn"

GROUND = ("_compat", "_version", "checks", "files", "device", "checkpoint")
"""Small utilities at the root: argument checks, atomic files, devices, checkpoints, Pyro's private names, the
version."""

LAYERS: dict[str, tuple[str, ...]] = {
    "ground": ("ground",),
    "distributions": ("ground",),
    "data": ("ground",),
    "networks": ("ground",),
    "handlers": ("ground", "distributions"),
    "model": ("ground", "distributions", "handlers.particles", "handlers.moments"),
    "guides": ("ground", "distributions", "model", "handlers.particles"),
    "infer": ("ground", "distributions", "handlers", "model", "guides"),
    "analysis": ("ground", "distributions", "data", "networks", "handlers", "model", "guides", "infer"),
    "methods": ("ground", "distributions", "data", "networks", "handlers", "model", "guides", "infer", "analysis"),
    "cli": ("ground", "distributions", "data", "networks", "handlers", "model", "guides", "infer", "analysis",
            "methods"),
    "face": ("ground", "distributions", "data", "networks", "handlers", "model", "guides", "infer", "analysis"),
    "studies": ("ground", "distributions", "data", "networks", "handlers", "model", "guides", "infer", "analysis",
                "methods", "cli"),
    "main": ("cli", "studies"),
}
"""What each layer may import from pyrobnn, besides itself. ``model`` reads only the particle layout (the
``align_targets`` effect) and ``Moments`` of ``handlers``, ``guides`` only its effects (which handler is
active); ``methods`` are objects over ``infer`` and ``analysis`` (a method trains, its posterior evaluates);
``face`` is ``pyrobnn/__init__.py``; ``studies`` run command lines of ``cli`` as cells; only ``__main__``
imports the studies (``pyrobnn study``), and only it and ``studies`` the command line."""


def layer_of(module: str) -> str:
    """The layer of a dotted module name under pyrobnn (``pyrobnn.handlers.moments`` -> ``handlers``)."""
    parts = module.split(".")
    if parts == ["pyrobnn"]:
        return "face"
    if parts[1] == "__main__":
        return "main"
    return "ground" if parts[1] in GROUND else parts[1]


def allows(layer: str, target: str) -> bool:
    if layer_of(target) == layer:
        return True
    name = ".".join(target.split(".")[1:3])
    return any(rule == layer_of(target) or name == rule or name.startswith(rule + ".") for rule in LAYERS[layer])


def modules() -> dict[str, pathlib.Path]:
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def imports(path: pathlib.Path) -> list[tuple[int, str, list[str]]]:
    """``(line, module, names)`` of every pyrobnn import in ``path`` (relative imports are refused outright)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            assert node.level == 0, f"{path}:{node.lineno}: relative import; pyrobnn imports absolutely, as Pyro"
            if node.module.split(".")[0] == "pyrobnn":
                found.append((node.lineno, node.module, [a.name for a in node.names]))
        elif isinstance(node, ast.Import):
            found += [(node.lineno, a.name, []) for a in node.names if a.name.split(".")[0] == "pyrobnn"]
    return found


def targets(module: str, names: list[str], known: dict) -> list[str]:
    """The modules an import statement loads: ``from pyrobnn.x import y`` loads ``pyrobnn.x.y`` when it is one."""
    return [f"{module}.{n}" if f"{module}.{n}" in known else module for n in names] or [module]


def violations(known: dict[str, pathlib.Path]) -> list[str]:
    found = []
    for module, path in known.items():
        layer = layer_of(module)
        for line, imported, names in imports(path):
            for target in targets(imported, names, known):
                if not allows(layer, target):
                    where = path.relative_to(PACKAGE.parent) if path.is_relative_to(PACKAGE.parent) else path.name
                    found.append(f"{where}:{line} imports {target}: the {layer} layer may "
                                 f"import only {', '.join(LAYERS[layer])} (tests/core/test_layers.py LAYERS)")
    return found


def test_every_import_runs_down_the_layers():
    assert violations(modules()) == []


def test_an_upward_import_is_reported_with_file_line_and_rule(tmp_path, monkeypatch):
    known = modules()
    upward = tmp_path / "upward.py"
    upward.write_text("from pyrobnn.infer.svi import fit\n")
    known["pyrobnn.model.upward"] = upward
    found = violations(known)
    assert len(found) == 1
    assert "upward.py:1 imports pyrobnn.infer.svi: the model layer may import only" in found[0]


@pytest.mark.parametrize("module", sorted(modules()))
def test_no_module_is_imported_for_its_side_effects(module):
    """Every imported name is used (ruff F401 checks it outside ``__init__``); an ``__init__`` uses what it imports
    or lists it in ``__all__``; no import is excused with ``noqa: F401``."""
    path = modules()[module]
    text = path.read_text()
    assert "noqa: F401" not in text, f"{path}: an import kept only for its side effect"
    if path.name == "__init__.py":
        tree = ast.parse(text)
        exported = next((ast.literal_eval(n.value) for n in tree.body if isinstance(n, ast.Assign)
                         and any(getattr(t, "id", None) == "__all__" for t in n.targets)), None)
        used = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
        for line, imported, names in imports(path):
            missing = [n for n in names if n not in used and (exported is None or n not in exported)]
            assert not missing, f"{path}:{line} imports {missing}, neither used nor exported in __all__"


def test_modules_form_no_cycle():
    known = modules()
    graph = {m: {t for _, i, names in imports(p) for t in targets(i, names, known) if t in known and t != m}
             for m, p in known.items()}
    state: dict[str, int] = {}

    def visit(node, trail):
        state[node] = 1
        for nxt in graph[node]:
            if state.get(nxt) == 1:
                raise AssertionError("import cycle: " + " -> ".join(trail[trail.index(nxt):] + [nxt]))
            if nxt not in state:
                visit(nxt, trail + [nxt])
        state[node] = 2

    for node in graph:
        if node not in state:
            visit(node, [node])

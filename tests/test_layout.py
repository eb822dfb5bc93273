"""The layout shows the architecture: no import circle between the project's modules.

Every ``import`` / ``from ... import`` anywhere in a module (function-level ones included) is an edge; a circle is
a strongly connected component of more than one module. Run as a script to print the graph's circles:
``python tests/test_layout.py``.
"""
from __future__ import annotations

import ast
import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def package_folders() -> dict[str, str]:
    """Installed package name -> its folder: pyproject.toml's ``package-dir`` installs three folders under other
    names (``properties/`` as ``specdec_properties``, ...); the others install as themselves."""
    renamed = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
    return {"specdec_ref": "specdec_ref", "conformance": "conformance", **renamed}


PACKAGES = package_folders()


def modules() -> dict[str, Path]:
    """Module name as imported (``specdec_fixtures.mutants.base``) -> its file (``fixtures/mutants/base.py``)."""
    out = {}
    for package, folder in PACKAGES.items():
        for path in sorted((ROOT / folder).rglob("*.py")):
            name = ".".join((package, *path.relative_to(ROOT / folder).with_suffix("").parts))
            out[name.removesuffix(".__init__")] = path
    return out


def _resolve(name: str, known) -> str | None:
    while name and name not in known:
        name = name.rpartition(".")[0]
    return name or None


def import_graph() -> dict[str, set[str]]:
    """``module -> modules it imports`` among the project's modules (a package's ``__init__`` is the package)."""
    known = modules()
    graph: dict[str, set[str]] = {m: set() for m in known}
    for name, path in known.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parent = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                    base = ".".join(parent + ([node.module] if node.module else []))
                subs = [f"{base}.{a.name}" for a in node.names if f"{base}.{a.name}" in known]
                targets = subs or [base]
            for target in targets:
                hit = _resolve(target, known)
                if hit and hit != name:
                    graph[name].add(hit)
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
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


def collapsed(graph: dict[str, set[str]], depth: int) -> dict[str, set[str]]:
    """The graph of the modules' first ``depth`` name parts: packages (1), their subpackages and modules (2), ..."""
    out: dict[str, set[str]] = {}
    for module, targets in graph.items():
        a = ".".join(module.split(".")[:depth])
        out.setdefault(a, set())
        for target in targets:
            b = ".".join(target.split(".")[:depth])
            if b != a:
                out[a].add(b)
                out.setdefault(b, set())
    return out


def _described(graph, found) -> str:
    return "\n".join("  " + ", ".join(c) + "\n" + "\n".join(f"    {m} -> {sorted(graph[m] & set(c))}" for m in c)
                     for c in found)


def test_no_import_circle():
    graph = import_graph()
    found = circles(graph)
    assert not found, "import circles:\n" + _described(graph, found)


def test_no_import_circle_between_packages_or_their_parts():
    """A circle through a package seen as one node (conformance -> fixtures -> conformance, through different
    modules), or through a package's subpackages (conformance.engines -> conformance.samples -> conformance.engines)."""
    graph = import_graph()
    for depth in (1, 2):
        level = collapsed(graph, depth)
        found = circles(level)
        assert not found, f"import circles between {'packages' if depth == 1 else 'subpackages'}:\n" + _described(level, found)
    assert circles(collapsed({"a.x": {"b.y"}, "b.z": {"a.w"}, "a.w": set(), "b.y": set()}, 1)) == [["a", "b"]]


def test_the_reference_algorithm_imports_neither_its_exact_models_nor_its_adapters():
    """``specdec_ref``'s own modules are the algorithm; ``specdec_ref.exact`` (models whose law is a table) and
    ``specdec_ref.adapters`` (other libraries behind the contract) sit on it. Guards the algorithm reaching into a
    test model or a third-party adapter (a dependency the reference must not have)."""
    graph = import_graph()
    apart = ("specdec_ref.exact", "specdec_ref.adapters")
    algorithm = [m for m in graph if m.startswith("specdec_ref") and not m.startswith(apart)]
    assert len(algorithm) > 20 and any(m.startswith(apart[0]) for m in graph) and any(m.startswith(apart[1]) for m in graph)
    wrong = sorted((m, t) for m in algorithm for t in graph[m] if t.startswith(apart))
    assert not wrong, "the algorithm imports the exact models or the adapters:\n" + "\n".join(f"  {m} -> {t}" for m, t in wrong)


def test_the_graph_sees_function_level_and_relative_imports():
    graph = import_graph()
    assert "conformance.registry" in graph["conformance.decoder_checks"]  # from .registry import ... (top level)
    assert "specdec_ref.dims" in graph["specdec_ref.forward"]  # from specdec_ref.dims import ... (inside a function)
    assert circles({"a": {"b"}, "b": {"a"}, "c": set()}) == [["a", "b"]]


#: Units of a measurement (a duration, a memory peak, a speed-up) as a module docstring would quote one.
_MEASURED = re.compile(r"\b\d+(?:\.\d+)?\s*(?:ms|us|µs|CPU-s|GB)\b|\b\d+(?:\.\d+)?\s*s (?:wall|sooner|in all)\b"
                       r"|\b\d+(?:\.\d+)?x (?:slower|faster)\b")
_RULE_LINE = re.compile(r"^\s*=+(?:\s+=+)+\s*$", re.M)
_DECIMAL = re.compile(r"(?<![\w.])\d+\.\d+(?:e-?\d+)?\b")


def docstring_measurements(text: str) -> list[str]:
    """What in a module docstring reads as a measurement: quoted durations, memory peaks or speed-ups, and tables
    whose rows hold decimal numbers (measurements age; docs/ keeps them, the docstring states the rule)."""
    found = [m.group(0) for m in _MEASURED.finditer(text)]
    if _RULE_LINE.search(text) and sum(len(_DECIMAL.findall(line)) >= 2 for line in text.splitlines()) >= 3:
        found.append("a table of decimal numbers")
    return found


def test_module_docstrings_state_rules_not_measurements():
    offenders = {}
    for name, path in modules().items():
        doc = ast.get_docstring(ast.parse(path.read_text()), clean=False) or ""
        if found := docstring_measurements(doc):
            offenders[name] = found[:4]
    assert not offenders, f"module docstrings quoting measurements (move them to docs/): {offenders}"
    assert docstring_measurements("took 2.5 CPU-s") and docstring_measurements(
        "== ==\n0.1 0.2\n0.3 0.4\n1.5 2.5\n== ==") and not docstring_measurements("alpha 1e-6 at 0.99 power")


if __name__ == "__main__":
    for component in circles(import_graph()) or [["no import circle"]]:
        print(", ".join(component))

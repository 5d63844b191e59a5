"""The layering rules of DESIGN.md ("Rules that keep the house simple"), as a test.

* The core (``shared/src/remit_core``) imports no framework and no adapter.
* Adapters never import each other.
* An adapter imports the core through ``remit_core`` and ``remit_core.adapter`` only,
  and only the names those modules list in ``__all__``: nothing private (no
  ``remit_core.x._name``, no private module), and no private member of the core's
  objects (``store._claim_conflict``).
* No import cycle among an adapter's modules, nor among the core's, counting every
  import statement wherever it is (a function-local import that would close a cycle
  counts too).
* remit-langgraph touches LangGraph's internals (``langgraph.pregel``,
  ``langgraph._internal``, any private module or name of ``langgraph``) in
  ``remit_langgraph/_seam.py`` only, the one module that checks them at import.

Read from the source trees (``ast``), so a rule broken in a module that is not imported
by any test still fails here.
"""

from __future__ import annotations

import ast
import importlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CORE = ROOT / "shared" / "src" / "remit_core"

#: package directory under packages/ -> the adapter's import name
ADAPTERS = {
    "remit-langgraph": "remit_langgraph",
    "remit-crewai": "remit_crewai",
    "remit-pydantic-graph": "remit_pydantic_graph",
}
#: packages/ directories that are not adapters (a new one must be listed in one of the two)
NOT_ADAPTERS = {"remit-check"}

#: what an adapter may import from the core
SEAM = ("remit_core", "remit_core.adapter")

#: the frameworks' (and their own dependencies') import names: never imported by the core
FRAMEWORKS = {"langgraph", "langchain", "langchain_core", "crewai", "pydantic_graph",
              "pydantic_ai"}


@dataclass(frozen=True)
class Import:
    file: Path
    line: int
    module: str  # the module imported (absolute)
    names: tuple[str, ...]  # names imported from it (``from m import a, b``); () for ``import m``

    def where(self) -> str:
        return f"{self.file.relative_to(ROOT)}:{self.line}"


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _module_name(path: Path, src: Path) -> str:
    parts = list(path.relative_to(src).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _is_package(path: Path) -> bool:
    return path.name == "__init__.py"


def imports(path: Path, src: Path) -> Iterator[Import]:
    """Every import statement of ``path`` (module level, in functions, under
    TYPE_CHECKING), with relative imports made absolute."""
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    here = _module_name(path, src)
    package = here if _is_package(path) else here.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield Import(path, node.lineno, alias.name, ())
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                module = ".".join([*base, node.module] if node.module else base)
            else:
                module = node.module or ""
            yield Import(path, node.lineno, module, tuple(a.name for a in node.names))


def sources(top: Path) -> list[Path]:
    return sorted(p for p in top.rglob("*.py") if "__pycache__" not in p.parts)


def adapter_dirs() -> dict[str, Path]:
    return {name: ROOT / "packages" / pkg / "src" / name for pkg, name in ADAPTERS.items()}


# ==================================================================================== rules


def core_framework_imports() -> list[str]:
    banned = FRAMEWORKS | set(ADAPTERS.values())
    return [f"{imp.where()}: the core imports {imp.module}"
            for path in sources(CORE) for imp in imports(path, CORE.parent)
            if imp.module.split(".")[0] in banned]


def cross_adapter_imports() -> list[str]:
    found = []
    for name, top in adapter_dirs().items():
        others = set(ADAPTERS.values()) - {name}
        for path in sources(top):
            for imp in imports(path, top.parent):
                if imp.module.split(".")[0] in others:
                    found.append(f"{imp.where()}: adapter {name} imports {imp.module}")
    return found


def _exported(module: str) -> set[str]:
    return set(getattr(importlib.import_module(module), "__all__", ()))


def _members(files: list[Path]) -> set[str]:
    """The private members defined on classes in ``files``: methods, class attributes,
    and ``self._x`` assignments."""
    names: set[str] = set()
    for path in files:
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                for item in node.body:
                    if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef):
                        names.add(item.name)
                    elif isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                        names.add(item.target.id)
                    elif isinstance(item, ast.Assign):
                        names.update(t.id for t in item.targets if isinstance(t, ast.Name))
            elif (isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store)
                  and isinstance(node.value, ast.Name) and node.value.id == "self"):
                names.add(node.attr)
    return {n for n in names if _private(n)}


def _dotted(node: ast.expr) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return f"{_dotted(node.value)}.{node.attr}"
    return ""


def seam_violations() -> list[str]:
    """Imports of the core other than through the seam, private names, and private
    members of the core's objects used by an adapter."""
    exported = {m: _exported(m) for m in SEAM}
    core_private = _members(sources(CORE))
    found: list[str] = []
    for top in adapter_dirs().values():
        files = sources(top)
        own = _members(files)
        for path in files:
            for imp in imports(path, top.parent):
                if imp.module.split(".")[0] != "remit_core":
                    continue
                module, names = imp.module, imp.names
                if module == "remit_core" and names and set(names) <= {"adapter"}:
                    module, names = "remit_core.adapter", ()
                if module not in SEAM:
                    found.append(f"{imp.where()}: imports {module}; an adapter imports the "
                                 f"core through {' and '.join(SEAM)} only")
                for n in names:
                    if _private(n) or any(_private(p) for p in module.split(".")):
                        found.append(f"{imp.where()}: imports {n} from {module}, a private "
                                     "name of the core")
                    elif module in SEAM and n not in exported[module]:
                        found.append(f"{imp.where()}: imports {n} from {module}, which is "
                                     f"not in its __all__ (what adapters may use)")
            tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
            for node in ast.walk(tree):
                if not (isinstance(node, ast.Attribute) and _private(node.attr)):
                    continue
                owner = _dotted(node.value)
                last = owner.rpartition(".")[2].lower()
                if "store" in last or (node.attr in core_private and node.attr not in own):
                    rel = path.relative_to(ROOT)
                    found.append(f"{rel}:{node.lineno}: uses {owner}.{node.attr}, a private "
                                 "member of the core")
    return found


def _edges(top: Path) -> dict[str, set[str]]:
    """module -> the modules of the same package it imports (anywhere in its source)."""
    pkg = top.name
    modules = {_module_name(p, top.parent): p for p in sources(top)}
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for here, path in modules.items():
        for imp in imports(path, top.parent):
            if imp.module.split(".")[0] != pkg:
                continue
            targets = set()
            for n in imp.names or ("",):
                sub = f"{imp.module}.{n}" if n else imp.module
                targets.add(sub if sub in modules else imp.module)
            graph[here] |= {t for t in targets if t in modules and t != here}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (each one is a set of
    modules that import each other, directly or not), sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def _cycle_through(graph: dict[str, set[str]], component: list[str]) -> list[str]:
    """A path from the component's first module back to itself (breadth first)."""
    start, members = component[0], set(component)
    paths = {start: [start]}
    todo = [start]
    while todo:
        v = todo.pop(0)
        for w in sorted(graph[v] & members):
            if w == start:
                return [*paths[v], start]
            if w not in paths:
                paths[w] = [*paths[v], w]
                todo.append(w)
    return component


def import_cycles(tops: list[Path]) -> list[str]:
    found = []
    for top in tops:
        graph = _edges(top)
        for component in cycles(graph):
            path = " -> ".join(_cycle_through(graph, component))
            found.append(f"{path} (one cycle among {', '.join(component)})")
    return found


def langgraph_internals() -> list[str]:
    """Imports of LangGraph internals outside remit_langgraph._seam."""
    top = adapter_dirs()["remit_langgraph"]
    found = []
    for path in sorted(top.rglob("*.py")):
        if path.name == "_seam.py":
            continue
        for imp in imports(path, top.parent):
            parts = imp.module.split(".")
            if parts[0] != "langgraph":
                continue
            internal = (parts[1:2] == ["pregel"] or any(_private(p) for p in parts)
                        or any(_private(n) for n in imp.names))
            if internal:
                what = f"{imp.module}" + (f" ({', '.join(imp.names)})" if imp.names else "")
                found.append(f"{imp.where()}: imports {what}, a LangGraph internal; only "
                             "remit_langgraph/_seam.py may, where it is checked at import")
    return found


# ==================================================================================== tests


def test_every_package_is_classified() -> None:
    """A new distribution under packages/ is either an adapter (the rules below apply to
    it) or listed as not one."""
    found = {p.name for p in (ROOT / "packages").iterdir() if (p / "pyproject.toml").exists()
             or (p / "src").is_dir()}
    assert found <= set(ADAPTERS) | NOT_ADAPTERS, found - set(ADAPTERS) - NOT_ADAPTERS
    assert all(d.is_dir() for d in adapter_dirs().values())


def test_the_core_imports_no_framework() -> None:
    found = core_framework_imports()
    assert not found, "\n".join(found)


def test_adapters_never_import_each_other() -> None:
    found = cross_adapter_imports()
    assert not found, "\n".join(found)


def test_adapters_use_the_core_through_the_seam_only() -> None:
    found = seam_violations()
    assert not found, "\n".join(found)


def test_no_import_cycle_inside_an_adapter() -> None:
    found = import_cycles(list(adapter_dirs().values()))
    assert not found, "\n".join(found)


def test_no_import_cycle_inside_the_core() -> None:
    found = import_cycles([CORE])
    assert not found, "\n".join(found)


def test_langgraph_internals_only_in_the_seam() -> None:
    found = langgraph_internals()
    assert not found, "\n".join(found)


@pytest.mark.parametrize("module", SEAM)
def test_the_seam_lists_only_what_exists(module: str) -> None:
    mod = importlib.import_module(module)
    missing = [n for n in getattr(mod, "__all__", ()) if not hasattr(mod, n)]
    assert missing == []


def test_the_cycle_finder_finds_a_cycle() -> None:
    """The checker itself: a -> b -> c -> a is reported, a tree is not."""
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(graph) == [["a", "b", "c"]]
    assert _cycle_through(graph, ["a", "b", "c"]) == ["a", "b", "c", "a"]
    assert cycles({"a": {"b", "c"}, "b": {"c"}, "c": set()}) == []

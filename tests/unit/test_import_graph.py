"""The package reads top-down: no import circle, and the core never reaches
into the command line or the dashboard.

Every import counts, including those under ``if TYPE_CHECKING:`` and inside
functions: a circle hidden there is still a circle a reader has to untangle,
and the next refactoring turns it into a runtime ``ImportError``.  ``app.py``
is the façade above the modules it builds on; they know the app through
``ports.Runtime`` and a few protocols like it, never by importing it.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import dumbwaiter

SRC = Path(dumbwaiter.__file__).parent
ROOT = "dumbwaiter"

#: not the core: the programs and pages built on it (they may import anything)
OUTSIDE_CORE = ("dumbwaiter.cli", "dumbwaiter.dashboard", "dumbwaiter.demo", "dumbwaiter.contrib")
#: what the core may not import
FORBIDDEN_FOR_CORE = ("dumbwaiter.cli", "dumbwaiter.dashboard")

#: circles inside engine packages, being taken apart by their own work
#: (issue 19.2); no new one may
#: appear, and a listed one may only shrink
KNOWN_CIRCLES = (frozenset({"brokers.redis.broker", "brokers.redis.bulk", "brokers.redis.events"}),)

#: imports of dumbwaiter modules inside core functions: each loads something
#: heavy only when used (pydantic for events, httpx for webhooks, an optional
#: extra) or breaks no circle; more need a reason, not a new lazy import
MAX_FUNCTION_IMPORTS = 18


@dataclass
class Module:
    name: str
    path: Path
    package: bool
    imports: set[str] = field(default_factory=set)
    in_functions: int = 0


def _modules() -> dict[str, Module]:
    found: dict[str, Module] = {}
    for path in sorted(SRC.rglob("*.py")):
        parts = [ROOT, *path.relative_to(SRC).with_suffix("").parts]
        package = parts[-1] == "__init__"
        if package:
            parts.pop()
        name = ".".join(parts)
        found[name] = Module(name, path, package)
    return found


def _resolve(mod: Module, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    base = mod.name.split(".")
    if not mod.package:
        base.pop()
    if node.level > 1:
        base = base[: len(base) - (node.level - 1)]
    return ".".join([*base, *([node.module] if node.module else [])])


def _targets(mod: Module, node: ast.AST, known: dict[str, Module]) -> Iterator[str]:
    if isinstance(node, ast.Import):
        names = [a.name for a in node.names]
    elif isinstance(node, ast.ImportFrom):
        base = _resolve(mod, node)
        names = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
    else:
        return
    for name in names:
        while name and name not in known:  # ``dumbwaiter.x.Y``: the module ``dumbwaiter.x``
            name = name.rpartition(".")[0]
        if name and name != mod.name:
            yield name


def _graph() -> dict[str, Module]:
    known = _modules()
    for mod in known.values():
        tree = ast.parse(mod.path.read_text(), str(mod.path))
        for node, in_function in _walk(tree, False):
            targets = list(_targets(mod, node, known))
            mod.imports.update(targets)
            if in_function:
                mod.in_functions += len(targets)
    return known


def _walk(node: ast.AST, in_function: bool) -> Iterator[tuple[ast.AST, bool]]:
    for child in ast.iter_child_nodes(node):
        yield child, in_function
        inner = in_function or isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef)
        yield from _walk(child, inner)


def _circles(graph: dict[str, Module]) -> list[frozenset[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[frozenset[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v].imports):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.add(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(frozenset(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def _short(names: frozenset[str]) -> frozenset[str]:
    return frozenset(n.removeprefix(ROOT + ".") for n in names)


def _core(name: str) -> bool:
    return not any(name == p or name.startswith(p + ".") for p in OUTSIDE_CORE) and (
        name != "dumbwaiter.__main__"
    )


GRAPH = _graph()


def test_the_import_graph_has_no_circle() -> None:
    unexpected = [
        sorted(_short(c))
        for c in _circles(GRAPH)
        if not any(_short(c) <= known for known in KNOWN_CIRCLES)
    ]
    assert not unexpected, (
        f"import circles (TYPE_CHECKING and function imports count): {unexpected}"
    )


def test_the_core_imports_nothing_from_the_cli_or_the_dashboard() -> None:
    bad = {
        m.name: sorted(
            t for t in m.imports if any(t == f or t.startswith(f + ".") for f in FORBIDDEN_FOR_CORE)
        )
        for m in GRAPH.values()
        if _core(m.name)
    }
    assert not {k: v for k, v in bad.items() if v}


def test_the_worker_knows_nothing_of_workflows_or_batches() -> None:
    """They hook in through the middleware's lifecycle hooks (``lifecycle.py``)."""
    worker = GRAPH["dumbwaiter.worker"].imports
    assert not worker & {
        "dumbwaiter.workflow",
        "dumbwaiter.batch",
        "dumbwaiter.lifecycle",
        "dumbwaiter.durable",
    }


def test_nothing_under_the_app_imports_it() -> None:
    importers = sorted(
        m.name
        for m in GRAPH.values()
        if "dumbwaiter.app" in m.imports and m.name in GRAPH["dumbwaiter.app"].imports
    )
    assert not importers


def test_function_level_imports_stay_few() -> None:
    counts = {m.name: m.in_functions for m in GRAPH.values() if _core(m.name) and m.in_functions}
    assert sum(counts.values()) <= MAX_FUNCTION_IMPORTS, counts


def test_the_graph_sees_every_kind_of_import() -> None:
    """The parser finds imports under TYPE_CHECKING, inside functions and
    relative ones (else the tests above could not fail)."""
    app = GRAPH["dumbwaiter.app"]
    assert "dumbwaiter.event" in app.imports  # inside a function (pydantic loads on first use)
    assert "dumbwaiter.webhooks.service" in app.imports  # TYPE_CHECKING and a function
    assert "dumbwaiter.task" in app.imports  # relative, at the top
    assert app.in_functions > 0
    made_up = {"a": Module("a", SRC, False, {"b"}), "b": Module("b", SRC, False, {"a"})}
    assert _circles(made_up) == [frozenset({"a", "b"})]

"""docs/architecture.md's layering, enforced on the source: which modules may import which.

Every module of ``src/trollout`` is parsed with `ast` (no import runs) into a graph of the
imports between our modules, lazy and ``TYPE_CHECKING`` ones included (``from .. import x``
is an edge to the package root). One table (`LAYERS`, shown again in docs/architecture.md)
says which packages each package may import, and every edge is checked against it; the table
points one way, so no allowed edge is a back edge, and no import cycle is left (but the one
the run layer removes). The rules on third-party imports (Ray, OpenTelemetry, asyncio) and
on the run folder (`recovery` reaches no `collector` module) follow the graph transitively,
so a module cannot break them through a neighbour.
"""

from __future__ import annotations

import ast
import functools
from collections.abc import Iterable, Iterator
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"
ROOT = "trollout"
# Leaves import nothing of ours but `trollout.errors` (a leaf package's modules, each other);
# a leaf added later goes here.
LEAVES = frozenset(
    {
        "trollout.records",
        "trollout.errors",
        "trollout.jsonl",
        "trollout.settings",
        "trollout.text",
        "trollout.paths",
        "trollout._version",
        "trollout.httpserver",
    }
)
LEAF_MAY_IMPORT = frozenset({"trollout.errors"})

Graph = dict[str, frozenset[str]]


def module_name(path: Path) -> str:
    """Return the dotted name of a source file (a package for ``__init__.py``)."""
    parts = path.relative_to(SRC).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported(node: ast.Import | ast.ImportFrom, package: str, known: set[str]) -> Iterator[str]:
    """Yield the modules of ours an import statement names, relative ones resolved."""
    if isinstance(node, ast.Import):
        yield from (alias.name for alias in node.names)
        return
    base = node.module or ""
    if node.level:
        anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
        base = ".".join([*anchor, base] if base else anchor)
    for alias in node.names:  # `from pkg import mod` names a module; otherwise the package
        yield f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base


def owning_module(name: str, known: set[str]) -> str | None:
    """Return the longest known module that `name` is or lies in (None: not ours)."""
    while name and name not in known:
        name = name.rpartition(".")[0]
    return name or None


@functools.cache
def graph() -> Graph:
    """Return every module of ours mapped to the modules of ours it imports directly."""
    files = {module_name(path): path for path in (SRC / ROOT).rglob("*.py")}
    known = set(files)
    edges: Graph = {}
    for name, path in files.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        targets = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if isinstance(node, ast.Import | ast.ImportFrom):
                targets |= {owning_module(t, known) for t in imported(node, package, known)}
        edges[name] = frozenset(t for t in targets if t is not None and t != name)
    return edges


def chains(start: str) -> dict[str, list[str]]:
    """Return every module `start` reaches, each with one import chain leading there."""
    seen: dict[str, list[str]] = {start: [start]}
    todo = [start]
    while todo:
        current = todo.pop()
        for target in sorted(graph()[current]):
            if target not in seen:
                seen[target] = [*seen[current], target]
                todo.append(target)
    return seen


def within(module: str, package: str) -> bool:
    """Whether `module` is `package` or lies inside it."""
    return module == package or module.startswith(package + ".")


def modules_in(package: str) -> list[str]:
    """Return the modules of `package` (itself included)."""
    return sorted(m for m in graph() if within(m, package))


def reaching(sources: Iterable[str], forbidden: tuple[str, ...]) -> list[str]:
    """Return the import chains from `sources` into any `forbidden` package."""
    found = []
    for module in sources:
        for target, chain in chains(module).items():
            if any(within(target, bad) for bad in forbidden):
                found.append(" -> ".join(chain))
    return found


def test_layering_graph_sees_every_module_and_relative_import() -> None:
    """The parser finds the layers and resolves relative imports (a guard on the guard)."""
    edges = graph()
    assert {"trollout", "trollout.collector.engine.collector", "trollout.cli.main"} <= set(edges)
    engine = edges["trollout.collector.engine.collector"]
    assert "trollout.collector.dispatch.request" in engine  # from ..dispatch.request
    assert "trollout.errors" in edges["trollout.settings.record"]  # from ..errors
    assert "trollout.collector.engine.collector" in edges["trollout"]  # from .collector.engine...


def test_layering_leaves_import_only_errors() -> None:
    """records, errors, jsonl, settings, text, paths, _version (any LEAVES module) import only
    `trollout.errors` (and, in a leaf package, their own package)."""
    edges = graph()
    assert edges["trollout.errors"] == frozenset()
    leaves = [m for m in sorted(edges) if is_leaf(m)]
    assert {"trollout.records.rows", "trollout.paths", "trollout.settings.loader"} <= set(leaves)
    for leaf in leaves:  # a leaf package's modules may import each other
        package = next(p for p in LEAVES if within(leaf, p))
        others = {m for m in edges[leaf] if not within(m, package)}
        assert others <= LEAF_MAY_IMPORT, f"{leaf} imports {sorted(others)}"


# The layering: each package (a unit of the table) mapped to the packages it may import. A
# module belongs to the longest unit its name lies in; the leaves are one unit. Edges inside a
# unit are always allowed; every other edge must be listed here. docs/architecture.md holds the
# same table (test_layering_table_matches_the_docs), so change both together.
EVERYTHING = "everything"
LAYERS: dict[str, frozenset[str]] = {
    name: frozenset(allowed)
    for name, allowed in {
        "leaves": (),
        "collector": (),
        "collector.http": ("leaves",),
        "collector.classify": ("leaves", "collector.http"),
        "collector.deployment": ("leaves", "collector.http"),
        "collector.planning": ("leaves",),
        "collector.dispatch": ("leaves", "collector.http", "collector.classify"),
        "collector.engine": (
            "leaves",
            "collector.http",
            "collector.classify",
            "collector.dispatch",
            "enrichment",
        ),
        "health": ("leaves",),
        "enrichment": ("leaves",),
        "recovery": ("leaves",),
        "metrics": ("leaves", "recovery", "collector.http", "health"),
        "telemetry": ("leaves", "collector.dispatch", "collector.engine", "health"),
        "run": (
            "leaves",
            "recovery",
            "collector.planning",
            "collector.deployment",
            "collector.http",
            "collector.engine",
            "metrics",
            "health",
            "telemetry",
            "scaleout",
        ),
        "frontends": (
            "leaves",
            "run",
            "collector.planning",
            "collector.deployment",
            "collector.http",
            "collector.engine",
        ),
        "view": ("leaves", "recovery", "metrics"),
        "aio": ("frontends",),
        "sync": ("frontends",),
        "scaleout": ("leaves", "recovery"),
        "scaleout.ray": (
            "leaves",
            "recovery",
            "collector.planning",
            "collector.deployment",
            "collector.engine",
            "metrics",
            "run",
            "scaleout",
            "telemetry",
        ),
        "nemo_gym": ("leaves", "aio", "trollout"),
        "testing": ("leaves",),
        "trollout": (
            "leaves",
            "recovery",
            "collector.planning",
            "collector.deployment",
            "collector.http",
            "collector.engine",
            "frontends",
            "run",
            "aio",
            "sync",
            "health",
        ),
        "cli": (EVERYTHING,),
    }.items()
}
DOCS = SRC.parent / "docs/architecture.md"


def is_leaf(module: str) -> bool:
    """Whether `module` is a leaf or lies in a leaf package (``trollout.records``)."""
    return any(within(module, leaf) for leaf in LEAVES)


def unit_of(module: str) -> str:
    """Return the unit of the table `module` belongs to (the longest that holds it)."""
    if is_leaf(module):
        return "leaves"
    name = module.removeprefix(ROOT + ".") if module != ROOT else ROOT
    while name and name not in LAYERS:
        name = name.rpartition(".")[0]
    assert name, f"{module} is in no unit of LAYERS: add its package to the table (and docs)"
    return name


def test_layering_every_import_is_allowed_by_the_table() -> None:
    """Every edge of the import graph goes inside a unit or to a unit its row allows."""
    refused = []
    for module, targets in sorted(graph().items()):
        source = unit_of(module)
        allowed = LAYERS[source]
        for target in sorted(targets):
            unit = unit_of(target)
            if unit != source and unit not in allowed and EVERYTHING not in allowed:
                refused.append(
                    f"{module} imports {target}: {source!r} may import only "
                    f"{sorted(allowed) or 'nothing outside itself'}, not {unit!r}"
                )
    assert refused == [], "\n".join(refused)


def test_layering_table_has_no_cycle_below_the_command_line() -> None:
    """The table itself points one way (cli, which may import everything, aside), so edges
    it allows can never close a loop between packages: no back edge."""
    below = {unit: allowed for unit, allowed in LAYERS.items() if EVERYTHING not in allowed}
    for unit in below:
        seen, todo = set(), [unit]
        while todo:
            for target in below.get(todo.pop(), frozenset()):
                assert target != unit, f"the table lets {unit!r} reach itself via {target!r}"
                if target not in seen:
                    seen.add(target)
                    todo.append(target)
    assert all(unit in LAYERS for allowed in below.values() for unit in allowed)


def documented_layers() -> dict[str, frozenset[str]]:
    """Return docs/architecture.md's table of allowed imports (its rows between the markers)."""
    text = DOCS.read_text(encoding="utf-8")
    start = text.index("<!-- layering table: start -->")
    end = text.index("<!-- layering table: end -->")
    rows: dict[str, frozenset[str]] = {}
    for line in text[start:end].splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) < 2 or not cells[0].startswith("`"):
            continue  # the marker, the header, its rule line
        allowed = cells[1]
        names = [part.strip().strip("`") for part in allowed.split(",") if part.strip()]
        names = [] if names == ["-"] else names
        rows[cells[0].strip("`")] = frozenset(EVERYTHING if n == "everything" else n for n in names)
    return rows


def test_layering_table_matches_the_docs() -> None:
    """docs/architecture.md shows the very table this test enforces."""
    assert documented_layers() == LAYERS


def strongly_connected() -> list[list[str]]:
    """Return the import graph's cycles: every strongly connected set of two or more modules."""
    edges = graph()
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(start: str) -> None:  # Tarjan's algorithm, iterative: no recursion limit
        work = [(start, iter(sorted(edges[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, targets = work[-1]
            target = next(targets, None)
            if target is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
            elif target not in index:
                index[target] = low[target] = len(index)
                stack.append(target)
                on_stack.add(target)
                work.append((target, iter(sorted(edges[target]))))
            elif target in on_stack:
                low[node] = min(low[node], index[target])

    for module in sorted(edges):
        if module not in index:
            visit(module)
    return found


def test_layering_no_import_cycle() -> None:
    """No set of modules imports itself round, counting lazy and TYPE_CHECKING imports (the
    engine's collector, pool and batch meet through `PoolHost` and `BatchHost`)."""
    cycles = strongly_connected()
    assert cycles == [], "import cycles: " + "; ".join(" <-> ".join(c) for c in cycles)


def test_layering_recovery_reaches_no_collector_module() -> None:
    """The run folder knows nothing of the engine: no chain from recovery into collector."""
    assert reaching(modules_in("trollout.recovery"), ("trollout.collector",)) == []


RAY_MODULES = frozenset(
    {
        "trollout.scaleout.ray.driver",
        "trollout.scaleout.ray.handout",
        "trollout.scaleout.ray.block",
    }
)


def lazily_imported(module: str) -> set[str]:
    """Return the modules of ours `module` imports inside a function (not at module level)."""
    path = SRC / (module.replace(".", "/") + ".py")
    package = module.rpartition(".")[0]
    known = set(graph())
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    top = {id(node) for node in tree.body}
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import | ast.ImportFrom) and id(node) not in top:
            found |= {owning_module(t, known) for t in imported(node, package, known)}
    return {m for m in found if m is not None}


def test_layering_only_the_ray_modules_import_ray() -> None:
    """Only scaleout.ray's modules import Ray; only cli reaches them, and lazily (one import
    inside `cli.scaleout.collect_any`), so neither ``import trollout`` nor the CLI loads Ray."""
    importers = set()
    for path in (SRC / ROOT).rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            names = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
                names = [node.module]
            if any(name == "ray" or name.startswith("ray.") for name in names):
                importers.add(module_name(path))
    assert importers == RAY_MODULES
    ray_package = {m for m in graph() if m.startswith("trollout.scaleout.ray")}
    reaching_ray = {m for m in graph() if graph()[m] & ray_package} - ray_package
    assert reaching_ray == {"trollout.cli.scaleout"}
    assert lazily_imported("trollout.cli.scaleout") & ray_package
    assert graph()["trollout.scaleout.ray"] == frozenset()  # the package imports nothing
    assert reaching(sorted(ray_package), ("trollout.cli",)) == []


TELEMETRY_IMPORTS = ("opentelemetry", "prometheus_client")
TELEMETRY_LIBRARY_MODULES = frozenset(
    {
        "trollout.telemetry.metrics",
        "trollout.telemetry.otlp_session",
        "trollout.telemetry.prometheus",
        "trollout.telemetry.runtime",
        "trollout.telemetry.traces",
        "trollout.scaleout.ray.telemetry",  # a Ray run's, imported only when telemetry is on
    }
)


def test_layering_only_telemetry_modules_import_opentelemetry() -> None:
    """OpenTelemetry and prometheus-client are imported by the telemetry modules alone, and
    nothing imports those modules at module level (off means off)."""
    importers = set()
    for path in (SRC / ROOT).rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            names = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
                names = [node.module]
            if any(name.split(".")[0] in TELEMETRY_IMPORTS for name in names):
                importers.add(module_name(path))
    assert importers == TELEMETRY_LIBRARY_MODULES


def test_the_command_line_loads_neither_asyncio_nor_the_front_ends() -> None:
    """``trollout`` (the package root and the CLI) imports the asyncio and blocking front ends
    lazily: a command-line run pays for neither at start-up, and only code that uses them
    loads asyncio (and trio-asyncio, which patches it process-wide)."""
    import subprocess
    import sys

    probe = (
        "import sys, trollout, trollout.cli.main; "
        "print(sorted(m for m in sys.modules if m == 'asyncio' or m.startswith("
        "('trio_asyncio', 'trollout.aio', 'trollout.sync', 'trollout.frontends.aio', "
        "'trollout.frontends.sync'))))"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout
    import trollout

    assert trollout.aio.open_rollouts is not None  # still reachable as attributes
    assert trollout.sync.open_rollouts is not None

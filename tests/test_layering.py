"""docs/architecture.md's layering, enforced on the source: which modules may import which.

Every module of ``src/trollout`` is parsed with `ast` (no import runs) into a graph of the
imports between our modules, lazy and ``TYPE_CHECKING`` ones included. The rules follow the
graph transitively, so a module cannot break them through a neighbour (``from .. import x``
is an edge to the package root, which composes everything).
"""

from __future__ import annotations

import ast
import functools
from collections.abc import Iterable, Iterator
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"
ROOT = "trollout"
# Leaves import nothing of ours but `trollout.errors`; a leaf added later goes here.
LEAVES = frozenset(
    {"trollout.records", "trollout.errors", "trollout.jsonl", "trollout.config", "trollout.text"}
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
    assert "trollout.errors" in edges["trollout.config"]  # from .errors
    assert "trollout.collector.engine.collector" in edges["trollout"]  # from .collector.engine...


def test_layering_leaves_import_only_errors() -> None:
    """records, errors, jsonl, config (and any LEAVES module) import only `trollout.errors`."""
    edges = graph()
    assert edges["trollout.errors"] == frozenset()
    for leaf in sorted(LEAVES & set(edges)):
        assert edges[leaf] <= LEAF_MAY_IMPORT, f"{leaf} imports {sorted(edges[leaf])}"


def test_layering_collector_never_imports_recovery_or_cli() -> None:
    """The engine writes to a sink it is given: collector reaches neither recovery nor cli."""
    forbidden = ("trollout.recovery", "trollout.cli")
    assert reaching(modules_in("trollout.collector"), forbidden) == []


def test_layering_only_cli_imports_cli() -> None:
    """cli composes the public API; nothing outside it imports it."""
    outside = [m for m in sorted(graph()) if not within(m, "trollout.cli")]
    assert reaching(outside, ("trollout.cli",)) == []


def test_layering_metrics_imports_neither_cli_nor_the_engine() -> None:
    """Aggregation reads run folders; it reaches neither cli nor collector.engine."""
    forbidden = ("trollout.cli", "trollout.collector.engine.collector")
    assert reaching(modules_in("trollout.metrics"), forbidden) == []


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
    ray_package = {"trollout.scaleout.ray", *RAY_MODULES}
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
    }
)


# The packages that compose a run (and so may start its telemetry): the run layer, and what
# sits above it.
COMPOSERS = ("trollout.cli", "trollout.run", "trollout.scaleout.ray", "trollout.telemetry")


def test_layering_telemetry_sits_beside_the_engine() -> None:
    """The engine knows only its observer hook: nothing below the run layer reaches telemetry,
    and telemetry (which watches the collector) reaches neither recovery nor cli."""
    below = [m for m in sorted(graph()) if not any(within(m, c) for c in COMPOSERS)]
    assert reaching(below, ("trollout.telemetry",)) == []
    forbidden = ("trollout.recovery", "trollout.cli")
    assert reaching(modules_in("trollout.telemetry"), forbidden) == []


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


def test_layering_the_run_layer_reaches_no_entry_point() -> None:
    """`trollout.run` is the one composition of a run: the entry points (cli, the Ray blocks,
    the front ends) call it, and it reaches none of them back."""
    forbidden = ("trollout.cli", "trollout.scaleout.ray", "trollout.frontends")
    assert reaching(modules_in("trollout.run"), forbidden) == []


# The packages held to no cycle at all; collector.engine (collector <-> batch, pool) and
# metrics (aggregate <-> report_html) still have one each, which their owners remove.
ACYCLIC = ("trollout.cli", "trollout.run", "trollout.scaleout", "trollout.frontends")


def test_layering_no_import_cycle() -> None:
    """No module of the entry points and the run layer reaches itself again through the
    imports of ours, lazy ones included (cli.collect and the Ray modules had one)."""
    cycles = []
    for module in [m for m in sorted(graph()) if any(within(m, p) for p in ACYCLIC)]:
        for target in graph()[module]:
            chain = chains(target)
            if module in chain:
                cycles.append(" -> ".join([module, *chain[module]]))
                break
    assert cycles == []


def test_cli_modules_are_at_most_250_lines() -> None:
    """The command line is parsing and printing: no module of cli/ grows past 250 lines (a
    longer one holds something the run layer or a package of its own should)."""
    long = {}
    for path in sorted((SRC / ROOT / "cli").glob("*.py")):
        lines = len(path.read_text(encoding="utf-8").splitlines())
        if lines > 250:
            long[path.name] = lines
    assert long == {}

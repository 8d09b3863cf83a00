"""The architecture, checked: layers and the order of the folders inside them, no import cycle,
no overlong function; a big module is only a warning.

Three layers: the core (``singleton`` outside ``singleton.service``) imports nothing above it;
``listeners`` imports only the core; ``singleton.service`` composes both. Inside the core the
folders are ordered ``drivers``/``lease`` < ``election`` < ``balance`` < ``jobs``, with the small
shared root modules (errors, clock, retry, ...) under all of them. Inside ``listeners``, the stream
and the checkpoints know neither the runtime that drives them nor any sink, and a sink knows only
the runtime's handover signal. Imports inside functions and under ``TYPE_CHECKING`` count: a
cycle hidden there is still a cycle to the reader.

Size is a smell, not a rule: a function body over ``MAX_FUNCTION_LINES`` fails unless
``LONG_FUNCTIONS`` gives a reason; a module over ``SOFT_MODULE_LINES`` only warns.
"""

from __future__ import annotations

import ast
import warnings
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("singleton", "listeners")
MAX_FUNCTION_LINES = 60
SOFT_MODULE_LINES = 500


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for pkg in PACKAGES for p in sorted((ROOT / pkg).rglob("*.py"))}


MODULES = _modules()
TREES = {name: ast.parse(path.read_text(), str(path)) for name, path in MODULES.items()}


def _imports(name: str, tree: ast.Module) -> dict[str, int]:
    """Every project module that ``name`` imports, anywhere in its body, with the line of the
    first import of it."""
    is_package = MODULES[name].name == "__init__.py"
    found: dict[str, int] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = name.split(".")
                if not is_package:
                    anchor = anchor[:-1]
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            # "from pkg import mod" imports the module pkg.mod; "from mod import name" imports mod
            targets = [
                f"{base}.{alias.name}" if f"{base}.{alias.name}" in MODULES else base
                for alias in node.names
            ]
        else:
            continue
        for t in targets:
            if t in MODULES and t != name:
                found[t] = min(found.get(t, node.lineno), node.lineno)
    return found


GRAPH = {name: _imports(name, tree) for name, tree in TREES.items()}


def _within(module: str, place: str) -> bool:
    return module == place or module.startswith(place + ".")


def _layer(module: str) -> str:
    if _within(module, "singleton.service"):
        return "service"
    return "listeners" if _within(module, "listeners") else "core"


ALLOWED = {
    "core": {"core"},
    "listeners": {"core", "listeners"},
    "service": {"core", "listeners", "service"},
}

_SINKS = ("listeners.elasticsearch",)
_CORE_FOLDERS = tuple(f"singleton.{f}" for f in ("drivers", "lease", "election", "balance", "jobs"))

#: (importer, what it must not import), each a module or a package; the order inside a layer
FORBIDDEN: tuple[tuple[str, tuple[str, ...]], ...] = (
    *((f"singleton.{m}", _CORE_FOLDERS) for m in ("errors", "clock", "retry", "redact", "latency")),
    # the in-memory fakes implement the lease and membership contracts, and nothing above them
    ("singleton.testing", ("singleton.drivers", "singleton.election", "singleton.jobs")),
    (
        "singleton.drivers",
        ("singleton.lease", "singleton.election", "singleton.balance", "singleton.jobs"),
    ),
    ("singleton.lease", ("singleton.election", "singleton.balance", "singleton.jobs")),
    ("singleton.election", ("singleton.balance", "singleton.jobs")),
    ("singleton.balance", ("singleton.jobs",)),
    ("listeners.stream", ("listeners.runtime", *_SINKS)),
    ("listeners.checkpoints", ("listeners.runtime", *_SINKS)),
    ("listeners.runtime", _SINKS),
    *((sink, ("listeners.runtime",)) for sink in _SINKS),
)

#: (importer, imported) -> why this edge is allowed although a rule above forbids it. Each one is
#: an exact pair of modules; an entry that no import matches any more fails, so the list shrinks.
EXCEPTIONS: dict[tuple[str, str], str] = {
    # a sink's bounded waits end when the tenure hands over: that signal is the runtime's contract
    # with sinks, not an internal
    ("listeners.elasticsearch.window", "listeners.runtime.handover"): "HandoverInterrupted",
    # The status board and the audit log are the reporting surfaces the runtime hands down:
    # the checkpoint policy posts what it saved, the stream reader the batch size it chose.
    (
        "listeners.checkpoints.policy",
        "listeners.runtime.audit",
    ): "reports each saved position to the audit trail",
    ("listeners.checkpoints.policy", "listeners.runtime.status"): "posts each save to the board",
    ("listeners.stream.reader", "listeners.runtime.status"): "posts its batch size to the board",
}


def _violations(module: str, imports: Mapping[str, int]) -> list[str]:
    """What ``module`` imports against the rules, each naming the import and its line."""
    path = MODULES[module].relative_to(ROOT) if module in MODULES else module
    layer = _layer(module)
    out = []
    for target, line in sorted(imports.items()):
        if _layer(target) not in ALLOWED[layer]:
            out.append(f"{path}:{line}: {module} ({layer}) imports {target} ({_layer(target)})")
            continue
        if (module, target) in EXCEPTIONS:
            continue
        for importer, banned in FORBIDDEN:
            hit = next((b for b in banned if _within(target, b)), None)
            if _within(module, importer) and hit is not None:
                out.append(f"{path}:{line}: {module} imports {target}: {importer} imports no {hit}")
    return out


@pytest.mark.parametrize("module", sorted(MODULES))
def test_layer_rules(module: str) -> None:
    wrong = _violations(module, GRAPH[module])
    assert not wrong, "\n".join(wrong)


def test_every_exception_is_still_needed() -> None:
    stale = [edge for edge in EXCEPTIONS if edge[1] not in GRAPH.get(edge[0], {})]
    assert not stale, f"no longer imported, remove from EXCEPTIONS: {stale}"


def test_no_import_cycle() -> None:
    """A depth-first search that reports the first back edge with its path."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(GRAPH[node]):
            if state.get(nxt) == 1:
                return [*stack[stack.index(nxt) :], nxt]
            if nxt not in state and (cycle := visit(nxt)) is not None:
                return cycle
        stack.pop()
        state[node] = 2
        return None

    for module in sorted(GRAPH):
        if module not in state and (cycle := visit(module)) is not None:
            pytest.fail("import cycle: " + " -> ".join(cycle))


def test_the_checker_sees_a_violation() -> None:
    """The rules above catch each kind of wrong import (the checker works)."""
    assert _violations("singleton.election.elector", {"singleton.service.replica": 3})
    assert _violations("singleton.lease.redis", {"singleton.jobs.scheduler": 7}) == [
        "singleton/lease/redis.py:7: singleton.lease.redis imports singleton.jobs.scheduler: "
        "singleton.lease imports no singleton.jobs"
    ]
    assert _violations("singleton.errors", {"singleton.lease.leases": 1})
    assert _violations("listeners.stream.reader", {"listeners.runtime.tenure": 1})
    assert _violations("listeners.checkpoints.stores", {"listeners.elasticsearch.sync": 1})
    assert _violations("listeners.elasticsearch.sync", {"listeners.runtime.runner": 1})
    assert not _violations("singleton.jobs.scheduler", {"singleton.balance.balancer": 1})
    assert "singleton.service.registry" in GRAPH["singleton.service.replica"]
    assert any(_within(t, "listeners") for t in GRAPH["listeners.runtime.runner"])


# -- size ------------------------------------------------------------------------------------

#: "module:qualified.name" -> why its body may be longer than MAX_FUNCTION_LINES
LONG_FUNCTIONS: dict[str, str] = {}


def _functions(
    body: list[ast.stmt], prefix: str = ""
) -> Iterator[tuple[str, ast.FunctionDef | ast.AsyncFunctionDef]]:
    for node in body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield prefix + node.name, node
            yield from _functions(node.body, f"{prefix}{node.name}.")
        elif isinstance(node, ast.ClassDef):
            yield from _functions(node.body, f"{prefix}{node.name}.")
        elif isinstance(node, (ast.If, ast.Try)):  # a definition under TYPE_CHECKING or a guard
            yield from _functions([*node.body, *node.orelse], prefix)


def _body_lines(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    """Lines from the first statement after the docstring to the end: documentation is free."""
    body = fn.body[1:] if ast.get_docstring(fn) is not None and len(fn.body) > 1 else fn.body
    return (fn.end_lineno or body[0].lineno) - body[0].lineno + 1


def _long_functions() -> dict[str, tuple[int, str]]:
    out = {}
    for module, tree in TREES.items():
        for qualname, fn in _functions(tree.body):
            if (n := _body_lines(fn)) > MAX_FUNCTION_LINES:
                out[f"{module}:{qualname}"] = (
                    n,
                    f"{MODULES[module].relative_to(ROOT)}:{fn.lineno}",
                )
    return out


LONG = _long_functions()


def test_no_function_is_too_long() -> None:
    wrong = [
        f"{where}: {name} has a {n}-line body (at most {MAX_FUNCTION_LINES}): one idea?"
        for name, (n, where) in sorted(LONG.items())
        if name not in LONG_FUNCTIONS
    ]
    assert not wrong, "\n".join(wrong)


def test_every_long_function_allowed_is_still_long() -> None:
    stale = sorted(set(LONG_FUNCTIONS) - set(LONG))
    assert not stale, f"within {MAX_FUNCTION_LINES} lines now (or gone), remove: {stale}"


def test_the_length_check_measures_the_body() -> None:
    code = 'def f():\n    """Doc\n    string."""\n' + "    x = 1\n" * 61
    ((name, fn),) = _functions(ast.parse(code).body)
    assert name == "f" and _body_lines(fn) == 61


def test_module_size_is_a_warning() -> None:
    for path in sorted(MODULES.values()):
        lines = len(path.read_text().splitlines())
        if lines > SOFT_MODULE_LINES:
            warnings.warn(
                f"{path.relative_to(ROOT)} has {lines} lines (over {SOFT_MODULE_LINES}): "
                "is it still one idea?",
                UserWarning,
                stacklevel=1,
            )

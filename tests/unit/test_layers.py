"""The architecture, checked: three layers, no import cycle, no oversized module.

core (``singleton`` outside ``singleton.service``) imports nothing above it; ``listeners`` imports
only the core; ``singleton.service`` composes both. Imports inside functions and under
``TYPE_CHECKING`` count: a cycle hidden there is still a cycle to the reader.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("singleton", "listeners")
MAX_LINES = 400


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for pkg in PACKAGES for p in sorted((ROOT / pkg).rglob("*.py"))}


MODULES = _modules()


def _imports(name: str, path: Path) -> set[str]:
    """Every project module that ``name`` imports, anywhere in its body."""
    tree = ast.parse(path.read_text(), str(path))
    is_package = path.name == "__init__.py"
    found: set[str] = set()
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
        found.update(t for t in targets if t.split(".")[0] in PACKAGES and t in MODULES)
    found.discard(name)
    return found


GRAPH = {name: _imports(name, path) for name, path in MODULES.items()}


def _layer(module: str) -> str:
    if module == "singleton.service" or module.startswith("singleton.service."):
        return "service"
    return "listeners" if module.split(".")[0] == "listeners" else "core"


ALLOWED = {
    "core": {"core"},
    "listeners": {"core", "listeners"},
    "service": {"core", "listeners", "service"},
}


@pytest.mark.parametrize("module", sorted(MODULES))
def test_layer_rules(module: str) -> None:
    layer = _layer(module)
    wrong = sorted(t for t in GRAPH[module] if _layer(t) not in ALLOWED[layer])
    assert not wrong, f"{module} ({layer}) imports {wrong}"


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


@pytest.mark.parametrize("module", sorted(MODULES))
def test_module_size(module: str) -> None:
    lines = len(MODULES[module].read_text().splitlines())
    assert lines <= MAX_LINES, f"{module} has {lines} lines (at most {MAX_LINES}): split it"


def test_the_checker_sees_a_violation() -> None:
    """The rules above would catch a core module importing the service (the checker works)."""
    assert _layer("singleton.election.elector") == "core"
    assert "service" not in ALLOWED[_layer("singleton.election.elector")]
    assert _layer("singleton.service.replica") == "service"
    assert "singleton.service.registry" in GRAPH["singleton.service.replica"]
    assert "listeners.base" in GRAPH["listeners.runtime.runner"] or any(
        t.startswith("listeners.") for t in GRAPH["listeners.runtime.runner"]
    )

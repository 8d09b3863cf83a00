"""``python -m bench [NAME ...]``: run every ``bench/*.py`` module's ``main()`` (or the named
ones) and print their results as one JSON document. Drop in ``bench/x.py`` to add one."""

from __future__ import annotations

import importlib
import json
import pkgutil
import sys
import traceback
from typing import Any

import bench


def modules() -> list[str]:
    return sorted(
        m.name for m in pkgutil.iter_modules(bench.__path__) if not m.name.startswith("_")
    )


def main(argv: list[str]) -> int:
    wanted = argv[1:] or modules()
    unknown = sorted(set(wanted) - set(modules()))
    if unknown:
        print(f"unknown benchmark(s) {unknown}; available: {modules()}", file=sys.stderr)
        return 2
    results: dict[str, Any] = {}
    failed = False
    for name in wanted:
        module = importlib.import_module(f"bench.{name}")
        run = getattr(module, "main", None)
        if not callable(run):
            continue
        try:
            results[name] = run()
        except Exception as exc:  # one broken benchmark must not hide the others' figures
            traceback.print_exc()
            results[name] = {"error": f"{type(exc).__name__}: {exc}"}
            failed = True
    print(json.dumps(results, indent=2, sort_keys=True))
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))

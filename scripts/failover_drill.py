#!/usr/bin/env python3
"""The failover drill, without the ``singleton`` entry point: ``python scripts/failover_drill.py
--rounds 20 --json``. Same flags and exit codes as ``singleton drill`` (the logic lives in
``singleton.service.drill``)."""

from __future__ import annotations

import sys

from singleton.service.drill.cli import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

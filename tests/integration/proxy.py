"""The black-holing TCP proxy now lives with the failover drill, which uses it too."""

from __future__ import annotations

from singleton.service.drill.proxy import TICK, TcpProxy

__all__ = ["TICK", "TcpProxy"]

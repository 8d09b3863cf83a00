"""``python -m singleton.service.dev.fakeredis_server PORT``: fakeredis over TCP, for machines
without
``redis-server`` (the embedded demo). Tests that need real Redis semantics use ``redis-server``."""

from __future__ import annotations

import sys


def main(argv: list[str]) -> int:
    from fakeredis import TcpFakeServer

    port = int(argv[1]) if len(argv) > 1 else 6379
    server = TcpFakeServer(("127.0.0.1", port), server_type="redis")
    server.serve_forever()
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))

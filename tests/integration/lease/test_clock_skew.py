"""A MongoDB lease backend, thread or asyncio, warns once when this host's wall clock is far
from the server's: the client runs under libfaketime, 30 s ahead of the real SecantusDB beside
it. The lease itself is granted and released as usual (expiry uses the server's clock)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap

import pytest

SCRIPT = textwrap.dedent(
    """
    import asyncio, sys
    from loguru import logger
    logger.remove()
    logger.add(sys.stdout, format="{level} {message}")
    url, kind = sys.argv[1], sys.argv[2]
    if kind == "thread":
        from singleton.lease.mongo import MongoLeaseBackend
        logger.enable("singleton")  # (after the import: it disables itself, as libraries do)
        b = MongoLeaseBackend(url, "skew" + sys.argv[3])
        lease = b.try_acquire("job", "me", 5)
        assert lease is not None and b.release(lease)
        b.close()
    else:
        from singleton.aio import AsyncMongoLeaseBackend
        logger.enable("singleton")
        async def main():
            b = AsyncMongoLeaseBackend(url, "skew" + sys.argv[3])
            lease = await b.try_acquire("job", "me", 5)
            assert lease is not None and await b.release(lease)
            await b.aclose()
        asyncio.run(main())
    print("done")
    """
)


@pytest.mark.parametrize("kind", ["thread", "asyncio"])
def test_a_client_clock_30s_ahead_is_reported_once(kind: str, mongo_url: str, unique: str) -> None:
    env = {**os.environ, "FAKETIME_DONT_FAKE_MONOTONIC": "1", "FAKETIME_DONT_RESET": "1"}
    out = subprocess.run(
        ["faketime", "-f", "+30s", sys.executable, "-c", SCRIPT, mongo_url, kind, unique],
        capture_output=True, text=True, timeout=60, env=env, check=False,
    )  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr
    warnings = [line for line in out.stdout.splitlines() if "clock skew" in line]
    assert len(warnings) == 1, out.stdout
    assert warnings[0].startswith("WARNING "), warnings
    skew = re.search(r"wall clock is ([-+]\d+\.\d+)s off", warnings[0])
    assert skew is not None and 28 < float(skew.group(1)) < 31, warnings
    assert out.stdout.splitlines()[-1] == "done"

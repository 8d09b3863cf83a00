"""Fenced leases on MongoDB for asyncio (pymongo's ``AsyncMongoClient``): the thread backend's
filters, update pipelines and answer parsing (:mod:`singleton.lease.mongo`), awaited.

Failure model: that of :mod:`singleton.lease.mongo` (every expiry decided by ``$$NOW`` inside
the write; majority writes; a timeout or network error is an unknown outcome and raises
``BackendUnavailableError``; the change stream only shortens waits). Every call is bounded by
``pymongo.timeout`` and awaits: the event loop never blocks on the store.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator, Mapping
from typing import Any

import pymongo
import pymongo.errors as perr
from pymongo import AsyncMongoClient, ReturnDocument
from pymongo.write_concern import WriteConcern

from singleton.aio.leases import AsyncReleaseFeed, AsyncServerLeases
from singleton.drivers.mongo import (
    Timeouts,
    building_client,
    classify,
    client_options,
    translate,
)
from singleton.errors import BackendError, ConfigurationError
from singleton.lease.leases import Lease, LeaseState, validate_lease_args
from singleton.lease.mongo import (
    _RELEASES,
    DEFAULT_TIMEOUT,
    POLL_MS,
    RELEASE_UPDATE,
    _contend_pipeline,
    _owned_by,
    check_options,
    contended,
    inspect_pipeline,
    lease_state,
    released_name,
    renew_update,
    report_clock_skew,
)
from singleton.redact import redact

Doc = dict[str, Any]


class AsyncMongoLeaseBackend(AsyncServerLeases):
    """Leases on MongoDB, awaited. Pass an ``AsyncMongoClient`` (never closed here) or a URL
    (the client built from it has the thread backend's bounded timeouts and is closed by
    :meth:`aclose`); the options are :class:`~singleton.lease.mongo.MongoLeaseBackend`'s
    (the clock skew is checked once, before the first contend or inspect)."""

    def __init__(
        self,
        client_or_url: AsyncMongoClient[Doc] | str,
        database: str = "singleton",
        collection: str = "leases",
        *,
        clock_skew_warning: float = 0.5,
        timeout: float = DEFAULT_TIMEOUT,
    ) -> None:
        check_options(database, collection, clock_skew_warning, timeout)
        self._timeout = float(timeout)
        self._skew_warning = float(clock_skew_warning)
        self._checked = False
        self._owned = isinstance(client_or_url, str)
        if isinstance(client_or_url, str):
            self._url = redact(client_or_url)
            # The socket may wait out one change-stream getMore (POLL_MS) on top of the timeout.
            timeouts = Timeouts(self._timeout, self._timeout + POLL_MS / 1000)
            with building_client(client_or_url):
                self._client: AsyncMongoClient[Doc] = AsyncMongoClient(
                    client_or_url, **client_options(timeouts)
                )
        elif isinstance(client_or_url, AsyncMongoClient):
            self._client = client_or_url
            seeds = self._client.topology_description.server_descriptions()
            self._url = "mongodb://" + ",".join(f"{h}:{p}" for h, p in seeds)
        else:
            raise ConfigurationError(
                f"expected a pymongo.AsyncMongoClient or a URL string, got {type(client_or_url)!r}"
            )
        self.database, self.collection = database, collection
        wc = WriteConcern("majority", wtimeout=int(self._timeout * 1000))
        self._coll = self._client[database].get_collection(collection, write_concern=wc)
        self._resume: Mapping[str, Any] | None = None
        self._releases = AsyncReleaseFeed(
            f"release change stream {self._url} {database}.{collection}",
            self._stream,
            (perr.PyMongoError,),
            open_timeout=self._timeout,
        )

    async def contend(self, name: str, holder: str, ttl: float) -> Lease | LeaseState | None:
        validate_lease_args(name, holder, ttl)
        pipeline = _contend_pipeline(holder, ttl)
        for attempt in (1, 2):  # once more if a concurrent upsert inserted the document first
            try:
                with self._translate("acquire", name):
                    await self._check_clock()
                    doc = await self._coll.find_one_and_update(
                        {"_id": name}, pipeline, upsert=True, return_document=ReturnDocument.AFTER
                    )
                return contended(name, holder, ttl, doc)
            except BackendError as exc:
                if attempt == 2 or not isinstance(exc.__cause__, perr.DuplicateKeyError):
                    raise
        raise AssertionError("unreachable")

    async def renew(self, lease: Lease, ttl: float | None = None) -> Lease | None:
        ttl = lease.ttl if ttl is None else ttl
        validate_lease_args(lease.name, lease.holder, ttl)
        with self._translate("renew", lease.name):
            doc = await self._coll.find_one_and_update(
                _owned_by(lease), renew_update(ttl), projection={"_id": 1}
            )
        return None if doc is None else Lease(lease.name, lease.holder, lease.token, ttl)

    async def release(self, lease: Lease) -> bool:
        validate_lease_args(lease.name, lease.holder)
        with self._translate("release", lease.name):
            doc = await self._coll.find_one_and_update(
                _owned_by(lease), RELEASE_UPDATE, projection={"_id": 1}
            )
        if doc is None:
            return False
        self._releases.notify(lease.name)  # local waiters need not wait for the stream
        return True

    async def inspect(self, name: str) -> LeaseState | None:
        validate_lease_args(name)
        with self._translate("inspect", name):
            await self._check_clock()
            cursor = await self._coll.aggregate(inspect_pipeline(name))
            docs = await cursor.to_list()
        return lease_state(name, docs[0], None) if docs else None

    def describe(self) -> str:
        return f"mongo {self._url} {self.database}.{self.collection}"

    async def aclose(self) -> None:
        await self._releases.close()
        if self._owned:
            with contextlib.suppress(perr.PyMongoError):
                await self._client.close()

    async def _stream(self) -> None:
        try:
            stream = await self._coll.watch(
                _RELEASES, max_await_time_ms=POLL_MS, resume_after=self._resume
            )
            async with stream:
                self._releases.opened()
                while not self._releases.closed:
                    change = await stream.try_next()
                    self._resume = stream.resume_token
                    name = None if change is None else released_name(change)
                    if name is not None:
                        self._releases.notify(name)
                    if not stream.alive:  # invalidated: the collection was dropped or renamed
                        self._resume = None
                        raise perr.PyMongoError("release change stream invalidated")
        except perr.PyMongoError as exc:
            if classify(exc) != "transient":
                self._resume = None  # history lost or an unresumable stream: start from now
            raise

    async def _check_clock(self) -> None:
        """Once: warn if this host's wall clock is far from the server's (informational;
        expiry never uses it). A failure is the operation's, which it precedes."""
        if self._checked:
            return
        before = time.time()
        hello = await self._client.admin.command("hello")
        after = time.time()
        self._checked = True
        report_clock_skew(hello, before, after, self._skew_warning, self._url)

    @contextlib.contextmanager
    def _translate(self, op: str, name: str) -> Iterator[None]:
        where = f"mongo {op} of lease {name!r} on {self._url} {self.database}.{self.collection}"
        with translate(where), pymongo.timeout(self._timeout):
            yield

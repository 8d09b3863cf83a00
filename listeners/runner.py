"""Run one :class:`~listeners.base.ChangeStreamListener` while an Elector leads.

Failure model: the process may lose its lease at any instant (pause, partition, a stale renew),
the stream's connection may drop, and the oplog may roll past the saved position. So:

* one worker thread per tenure, started only after the previous tenure's worker has ended;
* every blocking call is bounded (``max_await_time`` well under the renew deadline), and
  ``ctx.check()`` runs before every ``handle_batch`` and every checkpoint write; the checkpoint
  store fences writes by token, so a paused ex-leader cannot move the position afterwards;
* a checkpoint is written only after ``handle_batch`` returned (at-least-once on a crash);
* ``before_release`` (planned handover) finishes the batch in hand, checkpoints, and returns
  before the lease is released: the successor replays nothing.
"""

from __future__ import annotations

import contextlib
import random
import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import pymongo
from bson.timestamp import Timestamp
from loguru import logger

from listeners.audit import AuditLog, ts_pair
from listeners.base import ChangeEvent, ChangeStreamListener, ListenerContext, StopReason
from listeners.checkpoint import Checkpoint, CheckpointStore, MongoCheckpointStore, mongo_client
from listeners.deadletter import DeadLetterStore, PoisonEventError, PoisonHandler
from listeners.streams import (
    StandbyChecker,
    StartPosition,
    classify,
    cluster_time,
    token_time,
)
from singleton.clock import SYSTEM_CLOCK, Clock
from singleton.errors import (
    ConfigurationError,
    HistoryLostError,
    LeaseLostError,
    PermissionDeniedError,
    SingletonError,
    StaleWriterError,
)

if TYPE_CHECKING:
    from pymongo import MongoClient

    from singleton.elector import Elector
    from singleton.leadership import Leadership


class _Drained(Exception):
    """The planned handover finished: the last checkpoint is saved."""


def _buffered(stream: Any) -> bool:
    """Whether ``try_next()`` will answer from the local batch (pymongo 4 internals; on any
    change this degrades to "no", which is only slower)."""
    try:
        return bool(stream._cursor._has_next())
    except AttributeError:
        return False


class _Tenure:
    def __init__(self, ld: Leadership, previous: _Tenure | None) -> None:
        self.ld = ld
        self.previous = previous
        self.drain = threading.Event()
        self.done = threading.Event()
        self.thread: threading.Thread | None = None


class ListenerRunner:
    """Subscribe ``listener`` to ``elector``; stream, handle and checkpoint while it leads.

    ``max_await_time`` bounds each ``getMore`` and must be at most a quarter of the elector's
    ``renew_deadline``. Under sustained load the checkpoint is saved after a batch at most every
    ``checkpoint_interval`` seconds (0 = after every batch), and always as soon as the stream
    has caught up, before a handover and before an invalidate. ``idle_checkpoint_interval`` is
    how often an idle stream's advancing resume token is saved. Reconnects back off from
    ``reconnect_backoff`` to ``max_reconnect_backoff`` with jitter. Followers check every
    ``standby_interval`` seconds that the saved token can still be resumed (``None``: never).
    """

    def __init__(
        self,
        listener: ChangeStreamListener,
        elector: Elector,
        client_or_url: MongoClient[dict[str, Any]] | str,
        *,
        checkpoints: CheckpointStore | None = None,
        dead_letters: DeadLetterStore | None = None,
        clock: Clock | None = None,
        max_await_time: float = 0.1,  # also bounds how long a drain waits on an idle stream
        checkpoint_interval: float = 1.0,
        idle_checkpoint_interval: float = 5.0,
        reconnect_backoff: float = 0.1,
        max_reconnect_backoff: float = 5.0,
        standby_interval: float | None = 30.0,
        oplog_headroom_warning: float = 0.1,
        seed: int | None = None,
        audit: AuditLog | None = None,
    ) -> None:
        if not 0 < max_await_time <= elector.renew_deadline / 4:
            raise ConfigurationError(
                f"max_await_time must be > 0 and <= renew_deadline / 4 so that a lost lease is "
                f"noticed in time, got max_await_time={max_await_time!r}, "
                f"renew_deadline={elector.renew_deadline!r}"
            )
        if idle_checkpoint_interval <= 0 or not 0 < reconnect_backoff <= max_reconnect_backoff:
            raise ConfigurationError(
                "need idle_checkpoint_interval > 0 and 0 < reconnect_backoff <= "
                f"max_reconnect_backoff, got {idle_checkpoint_interval!r}, "
                f"{reconnect_backoff!r}, {max_reconnect_backoff!r}"
            )
        self.listener = listener
        self.elector = elector
        self.name = listener.lease_name
        self._client, self._owns_client = mongo_client(client_or_url)
        self.checkpoints = checkpoints or MongoCheckpointStore(self._client)
        self.dead_letters = dead_letters or DeadLetterStore(self._client)
        self._clock = clock or SYSTEM_CLOCK
        self.max_await_time = max_await_time
        self._op_timeout = elector.renew_deadline / 2
        self.checkpoint_interval = checkpoint_interval
        self.idle_checkpoint_interval = idle_checkpoint_interval
        self._backoff = (reconnect_backoff, max_reconnect_backoff)
        self._rng = random.Random(seed)
        self._lock = threading.Lock()
        self._tenure: _Tenure | None = None
        self._stopping = threading.Event()
        self._started = False
        #: the drill's evidence (see listeners.audit); owned by whoever passed it in
        self._audit = audit
        self._status: dict[str, Any] = {
            "listener": self.name,
            "state": "follower",
            "fencing_token": None,
            "last_checkpoint_cluster_time": None,
            "last_checkpoint_at": None,
            "events_handled": 0,
            "batches": 0,
            "dead_lettered": 0,
            "history_lost": 0,
            "reconnects": 0,
            "last_error": None,
        }
        self.standby = StandbyChecker(
            self._client,
            self.checkpoints,
            listener,
            interval=standby_interval,
            headroom_warning=oplog_headroom_warning,
            is_leading=lambda: self.elector.is_leader,
            stopping=self._stopping,
        )

    # -- lifecycle ------------------------------------------------------------------------
    def start(self) -> ListenerRunner:
        """Subscribe to the elector and start it (idempotent), and the standby checks."""
        with self._lock:
            if self._started:
                return self
            self._started = True
        self.elector.subscribe(
            on_elected=self._on_elected, on_lost=self._on_lost, before_release=self._drain
        )
        logger.info("listener runner starting: listener={} elector={}", self.name, self.elector)
        self.elector.start()
        ld = self.elector.leadership
        if ld is not None:  # elected before we subscribed
            self._on_elected(ld)
        self.standby.start()
        return self

    def stop(self, release: bool = True, timeout: float | None = 30.0) -> None:
        """Stop the elector (draining first when leading), the worker and the standby checks."""
        self._stopping.set()
        self.elector.stop(release=release, timeout=timeout)
        tenure = self._tenure
        if tenure is not None and tenure.thread is not None:
            tenure.thread.join(timeout)
        self.standby.stop(timeout)
        self._set(state="stopped")
        if self._owns_client:
            self._client.close()
        logger.info("listener runner stopped: listener={}", self.name)

    def status(self) -> dict[str, Any]:
        """A snapshot: state, last checkpoint, counters, last error, standby readiness."""
        with self._lock:
            out = dict(self._status)
        out["leader"] = self.elector.is_leader
        out["standby"] = self.standby.result()
        return out

    # -- elector callbacks (elector threads: return quickly) -------------------------------
    def _on_elected(self, ld: Leadership) -> None:
        with self._lock:
            if self._stopping.is_set() or (self._tenure is not None and self._tenure.ld is ld):
                return
            tenure = _Tenure(ld, self._tenure)
            self._tenure = tenure
        if self._audit is not None:
            self._audit.record("elected", token=ld.token)
        tenure.thread = threading.Thread(
            target=self._run_tenure, args=(tenure,), name=f"listener-{self.name}", daemon=True
        )
        tenure.thread.start()

    def _on_lost(self, ld: Leadership, reason: str) -> None:
        logger.info("listener tenure over ({}): listener={} token={}", reason, self.name, ld.token)
        if self._audit is not None:
            self._audit.record("lost", token=ld.token, reason=reason)

    def _drain(self, ld: Leadership) -> None:
        tenure = self._tenure
        if tenure is None or tenure.ld is not ld:
            return
        logger.info("draining before release: listener={} token={}", self.name, ld.token)
        self._set(state="draining")
        tenure.drain.set()
        tenure.done.wait(self.elector.release_timeout)

    # -- one tenure (worker thread) -------------------------------------------------------
    def _run_tenure(self, tenure: _Tenure) -> None:
        prev = tenure.previous
        if prev is not None and prev.thread is not None:
            prev.thread.join()  # tenures never overlap in one process
        tenure.previous = None
        ld = tenure.ld
        ctx = ListenerContext(
            leadership=ld,
            client=self._client,
            logger=logger.bind(listener=self.name, token=ld.token),
            listener_name=self.name,
            progress=self.checkpoints,
        )
        reason: StopReason = "error"
        try:
            if ld.valid():
                logger.info("listener leading: listener={} token={}", self.name, ld.token)
                self._set(state="starting", fencing_token=ld.token, last_error=None)
                self.listener.on_start(ctx)
                self._lead(tenure, ctx)
            reason = "released"
        except _Drained:
            reason = "released"
        except StaleWriterError as exc:
            logger.error("stale writer, stopping tenure: listener={}: {}", self.name, exc)
            self._set(last_error=str(exc))
            reason = "lost"
        except LeaseLostError:
            reason = "expired" if ld.reason in (None, "expired") else "lost"
        except HistoryLostError as exc:  # already logged once, at ERROR
            self._set(state="failed", last_error=str(exc))
        except Exception as exc:
            logger.error("listener failed: listener={} token={}: {!r}", self.name, ld.token, exc)
            self._set(state="failed", last_error=f"{type(exc).__name__}: {exc}")
        finally:
            try:
                self.listener.on_stop(ctx, reason)
            except Exception:
                logger.exception("on_stop failed: listener={}", self.name)
            if self._status["state"] != "failed":
                self._set(state="follower")
            logger.info("listener stopped ({}): listener={} token={}", reason, self.name, ld.token)
            tenure.done.set()

    def _lead(self, tenure: _Tenure, ctx: ListenerContext) -> None:
        with self._bounded():
            cp = self.checkpoints.load(self.name)
        self._last = cp
        if cp is not None:
            pos = StartPosition.of(cp)
        elif self.listener.has_initial_sync():
            pos = self._sync(ctx, "initial sync")
        else:
            pos = StartPosition()
        failures = 0
        while True:
            ctx.check()
            try:
                pos = self._stream(tenure, ctx, pos)
                failures = 0
            except (LeaseLostError, _Drained, PoisonEventError):
                raise
            except Exception as exc:
                kind = classify(exc)
                if kind == "history_lost":
                    pos = self._history_lost(ctx, exc)
                    continue
                if kind == "permission":
                    raise PermissionDeniedError(
                        f"listener {self.name!r}: MongoDB refused the change stream (check the "
                        f"user's roles: changeStream and find on {self.listener.database}): {exc}"
                    ) from exc
                if kind == "fatal":
                    raise
                failures += 1
                self._reconnect_wait(tenure, ctx, failures, exc)
                try:
                    with self._bounded():
                        self._last = self.checkpoints.load(self.name) or self._last
                except SingletonError as load_exc:
                    logger.warning("checkpoint reload failed: listener={}: {}", self.name, load_exc)
                pos = StartPosition.of(self._last) if self._last is not None else pos

    def _stream(self, tenure: _Tenure, ctx: ListenerContext, pos: StartPosition) -> StartPosition:
        """Stream until an invalidate (returns where to continue), a drain, or an error."""
        lst = self.listener
        target: Any = self._client[lst.database or ""]
        if lst.collection is not None:
            target = target[lst.collection]
        kwargs = pos.watch_kwargs()
        fresh_time = None
        if pos.fresh:
            fresh_time = self._cluster_time()
            kwargs["start_at_operation_time"] = fresh_time
        if lst.full_document is not None:
            kwargs["full_document"] = lst.full_document
        ld = ctx.leadership
        with self._bounded():
            opened = target.watch(
                list(lst.pipeline),
                max_await_time_ms=max(1, int(self.max_await_time * 1000)),
                batch_size=lst.batch_size,
                **kwargs,
            )
        with opened as stream:
            self._set(state="streaming")
            if fresh_time is not None:  # a successor must never start from a later "now"
                self._save(ctx, stream.resume_token, fresh_time)
            batch: list[ChangeEvent] = []
            first_at = last_save = self._clock.monotonic()
            # Handled but not yet saved (under sustained load a checkpoint is written at most
            # every ``checkpoint_interval``; a crash replays at most that much).
            pending: tuple[Any, Timestamp | None] | None = None
            while True:
                if tenure.drain.is_set():
                    if batch:
                        self._flush(ctx, batch)
                    if stream.resume_token != self._saved_token():
                        self._save(
                            ctx, stream.resume_token, None if pending is None else pending[1]
                        )
                    raise _Drained
                if ld.lost.is_set():
                    ctx.check()
                if _buffered(stream):  # no I/O: skip the timeout context (a hot path)
                    event = stream.try_next()
                else:
                    with self._bounded():
                        event = stream.try_next()
                now = self._clock.monotonic()
                if event is None:  # caught up: save what was handled, or the idle advance
                    if batch:
                        pending = self._flush(ctx, batch, stream.resume_token)
                        batch = []
                    if pending is not None or (
                        now - last_save >= self.idle_checkpoint_interval
                        and stream.resume_token != self._saved_token()
                    ):
                        self._save(
                            ctx, stream.resume_token, None if pending is None else pending[1]
                        )
                        pending, last_save = None, now
                    continue
                if event.get("operationType") == "invalidate":
                    if batch:
                        self._save(ctx, *self._flush(ctx, batch, batch[-1]["_id"]))
                    elif pending is not None:
                        self._save(ctx, *pending)
                    return self._invalidated(ctx, event)
                if not batch:
                    first_at = now
                batch.append(event)
                if len(batch) >= lst.batch_size or now - first_at >= lst.max_batch_wait:
                    pending = self._flush(ctx, batch, stream.resume_token)
                    batch = []
                    if now - last_save >= self.checkpoint_interval:
                        self._save(ctx, *pending)
                        pending, last_save = None, now

    def _flush(
        self, ctx: ListenerContext, batch: Sequence[ChangeEvent], token: Any = None
    ) -> tuple[Any, Timestamp | None]:
        """Deliver ``batch``; return the position after it, to be saved by the caller."""
        handler = PoisonHandler(
            self.listener.handle_batch,
            self.dead_letters,
            max_retries=self.listener.max_retries,
            policy=self.listener.on_poison,
            rng=self._rng,
        )
        sent = self._audit.now() if self._audit is not None else 0.0
        handler.deliver(batch, ctx)
        if self._audit is not None:
            last = batch[-1].get("clusterTime")
            self._audit.record("batch", token=ctx.token, n=len(batch), ct=ts_pair(last), sent=sent)
        with self._lock:
            self._status["events_handled"] += len(batch) - handler.dead_lettered
            self._status["dead_lettered"] += handler.dead_lettered
            self._status["batches"] += 1
        return token, batch[-1].get("clusterTime")

    def _invalidated(self, ctx: ListenerContext, event: ChangeEvent) -> StartPosition:
        logger.info("stream invalidated: listener={} token={}", self.name, ctx.token)
        ctx.check()
        self.listener.on_invalidate(event, ctx)
        self._save(ctx, event["_id"], event.get("clusterTime"), start_after=True)
        return StartPosition(start_after=event["_id"])

    def _sync(self, ctx: ListenerContext, why: str) -> StartPosition:
        """Take the cluster time first, copy, checkpoint that time, then stream from it."""
        at = self._cluster_time()
        logger.info("{} starting: listener={} token={} from={}", why, self.name, ctx.token, at)
        self._set(state="syncing")
        ctx.check()
        self.listener.initial_sync(ctx)
        self._save(ctx, None, at)
        logger.info("{} done: listener={} token={}", why, self.name, ctx.token)
        return StartPosition(at_time=at)

    def _history_lost(self, ctx: ListenerContext, exc: BaseException) -> StartPosition:
        policy = self.listener.on_history_lost
        since = None if self._last is None else self._last.cluster_time
        with self._lock:
            self._status["history_lost"] += 1
        logger.error(
            "change stream history lost: listener={} token={} saved_position={} policy={}: {}",
            self.name,
            ctx.token,
            since,
            policy,
            exc,
        )
        if policy == "fail" or (policy == "resync" and not self.listener.has_initial_sync()):
            raise HistoryLostError(
                f"listener {self.name!r}: the saved position {since} is no longer in the oplog "
                f"(policy {policy!r}): {exc}"
            ) from exc
        if policy == "resync":
            return self._sync(ctx, "resync")
        now = self._cluster_time()
        with self._bounded():
            self.dead_letters.record_gap(ctx, since, now, f"history lost: {exc}")
        self._save(ctx, None, now)
        return StartPosition(at_time=now)

    def _reconnect_wait(
        self, tenure: _Tenure, ctx: ListenerContext, failures: int, exc: BaseException
    ) -> None:
        low, high = self._backoff
        delay = min(high, low * 2 ** (failures - 1)) * self._rng.uniform(0.5, 1.0)
        with self._lock:
            self._status["reconnects"] += 1
            self._status["last_error"] = f"{type(exc).__name__}: {exc}"
        self._set(state="reconnecting")
        logger.warning(
            "change stream failed (attempt {}), reopening from the checkpoint in {:.2f}s: "
            "listener={} token={}: {!r}",
            failures,
            delay,
            self.name,
            ctx.token,
            exc,
        )
        deadline = self._clock.monotonic() + delay
        while (left := deadline - self._clock.monotonic()) > 0:
            if ctx.leadership.lost.wait(min(left, 0.05)) or tenure.drain.is_set():
                break
        if tenure.drain.is_set():
            raise _Drained  # nothing in hand: the last checkpoint stands
        ctx.check()

    # -- checkpoints ----------------------------------------------------------------------
    _last: Checkpoint | None = None

    def _saved_token(self) -> Any:
        return None if self._last is None else self._last.resume_token

    def _save(
        self,
        ctx: ListenerContext,
        token: Any,
        fallback: Timestamp | None = None,
        *,
        start_after: bool = False,
    ) -> None:
        times = [t for t in (token_time(token), fallback) if t is not None]
        if self._last is not None:
            times.append(self._last.cluster_time)
        if not times:
            raise SingletonError(f"listener {self.name!r}: no cluster time for a checkpoint")
        ld = ctx.leadership
        cp = Checkpoint(self.name, token, max(times), ld.token, ld.holder, start_after=start_after)
        ctx.check()
        sent = self._audit.now() if self._audit is not None else 0.0
        with self._bounded():
            self.checkpoints.save(cp)
        if self._audit is not None:
            self._audit.record("checkpoint", token=ld.token, ct=ts_pair(cp.cluster_time), sent=sent)
        self._last = cp
        self._set(last_checkpoint_cluster_time=cp.cluster_time, last_checkpoint_at=self._wall())
        logger.debug("checkpoint: listener={} token={} at={}", self.name, ld.token, cp.cluster_time)

    def _bounded(self) -> contextlib.AbstractContextManager[None]:
        """Every MongoDB call of the worker (server selection included) ends within half the
        renew deadline, so a lost lease is noticed in time whatever the network does."""
        return pymongo.timeout(self._op_timeout)

    def _cluster_time(self) -> Timestamp:
        with self._bounded():
            return cluster_time(self._client)

    def _wall(self) -> float:
        return self._clock.time()

    def _set(self, **fields: Any) -> None:
        with self._lock:
            self._status.update(fields)

"""Never stuck, never silent (SecantusDB): a tenure whose work fails for good ends, the lease is
released at once, the replica turns not ready naming the reason, and exactly one ERROR line says
so; transient failures are retried in place within ``failure_budget``; replicas that all fail the
same way settle into a visible steady state with growing cooldowns (no tight loop)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import pytest

from listeners.base import ChangeEvent, ListenerContext
from singleton.errors import BackendUnavailableError, SinkLostError
from singleton.service.dev.embedded import wait_until
from tests.integration.listener_support import (
    LogCapture,
    Recorder,
    Scene,
    failed_lines,
    handled_by,
    resigned,
    wait_recovered,
    wait_state,
)


class CopyRejected(Recorder):
    """The initial copy fails the way a whole-request HTTP 400 from Elasticsearch does."""

    def initial_sync(self, ctx: ListenerContext) -> None:
        raise ValueError("HTTP 400: the whole bulk request was rejected (mapper_parsing_exception)")


class CopyUnavailable(Recorder):
    """The initial copy's target is unreachable until ``healthy`` is set."""

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self.attempts = 0
        self.healthy = False

    def initial_sync(self, ctx: ListenerContext) -> None:
        self.attempts += 1
        if not self.healthy:
            raise BackendUnavailableError("sink unreachable (connection refused)")
        self.syncs += 1


class LosesItsSinkOnce(Recorder):
    """A sink that says, once, that it lost what it held (at the event of ``_id`` "gone"), and
    whose resync copy then fails for good: that tenure ends mid-copy, and nothing the sink or
    the stream shows afterwards tells its successor that the copy is still owed."""

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self.copies: list[tuple[int, dict[str, Any] | None]] = []  # token, progress seen
        self.said = False

    def handle_batch(self, events: Sequence[ChangeEvent], ctx: ListenerContext) -> int | None:
        if not self.said and any(e["documentKey"]["_id"] == "gone" for e in events):
            self.said = True
            raise SinkLostError("the index is gone")
        return super().handle_batch(events, ctx)

    def initial_sync(self, ctx: ListenerContext) -> None:
        self.copies.append((ctx.token, ctx.load_progress()))
        if len(self.copies) == 2:
            ctx.save_progress({"copied": 1})
            raise ValueError("HTTP 400: the whole bulk request was rejected")
        ctx.save_progress(None)


@pytest.fixture
def scene(mongo_url: str, unique: str) -> Iterator[Scene]:
    yield Scene.on(mongo_url, unique)


def test_a_permanent_failure_in_the_initial_copy_releases_and_says_so(scene: Scene) -> None:
    runner = scene.runner(CopyRejected(database=scene.db, collection="c"))
    with resigned(scene, runner) as logs:
        status = runner.status()
    assert not status.ready
    assert status.failure is not None and "ValueError" in status.failure and "400" in status.failure
    assert status.last_outcome is not None
    assert (status.last_outcome.kind, status.last_outcome.retryable) == ("failed", False)
    lines = failed_lines(logs)
    assert len(lines) == status.failed_tenures >= 1  # one ERROR per failed tenure
    first = lines[0]
    assert first["listener"] == runner.name and first["identity"] == "a"
    assert int(first["token"]) > 0 and "400" in first["reason"] and first["retryable"] == "False"
    assert status.as_dict()["ready"] is False and status.listener_failed == 1


def test_a_transient_failure_is_retried_in_place_then_fails_past_its_budget(scene: Scene) -> None:
    listener = CopyUnavailable(database=scene.db, collection="c")
    runner = scene.runner(listener, failure_budget=0.5, reconnect_backoff=0.05)
    with resigned(scene, runner) as logs:
        failed = runner.status()
        listener.healthy = True  # the sink is back: a later tenure succeeds
        recovered = wait_recovered(runner)
    assert failed.last_outcome is not None
    assert (failed.last_outcome.kind, failed.last_outcome.retryable) == ("failed", True)
    assert failed.failure is not None and "RetriesExhaustedError" in failed.failure
    assert "still failing" in failed.failure and "unreachable" in failed.failure
    assert failed.reconnects >= 2  # retried in place before giving up
    assert recovered.failure is None and recovered.leader and listener.syncs == 1
    assert len(failed_lines(logs)) == failed.failed_tenures


def _without_tracebacks(logs: LogCapture) -> LogCapture:
    """``logs`` but the listener's own tracebacks (each logged once per tenure at ERROR)."""
    logs.errors = [m for m in logs.errors if not m.startswith("handle_batch raised ")]
    return logs


def test_every_replica_failing_the_same_way_is_a_visible_steady_state(scene: Scene) -> None:
    listeners = [scene.listener("p", on_poison="stop", max_retries=0) for _ in range(2)]
    for listener in listeners:
        listener.fail = lambda e: e["documentKey"]["_id"] == 3
    runners = [
        scene.runner(listener, identity, max_failure_cooldown=8.0)
        for listener, identity in zip(listeners, "ab", strict=True)
    ]
    with LogCapture() as logs:
        for runner in runners:
            runner.start()
        try:
            wait_until(
                lambda: any(r.status().state == "streaming" for r in runners), 10, what="a leader"
            )
            scene.coll("p").insert_many([{"_id": i} for i in range(3)])
            wait_until(lambda: len(handled_by(*listeners)) == 3, 10, what="3 handled")
            scene.coll("p").insert_many([{"_id": i} for i in range(3, 6)])
            # Each replica fails twice: the second cooldown is about twice the first.
            wait_until(
                lambda: all(r.status().failed_tenures >= 2 for r in runners), 30, what="2 each"
            )
            wait_until(lambda: scene.backend.inspect(runners[0].name) is None, 5, what="free")
            statuses = [r.status() for r in runners]
        finally:
            for runner in runners:
                runner.stop()
    for status in statuses:
        assert not status.ready and status.failure is not None
        assert "PoisonEventError" in status.failure
    tracebacks = [m for m in logs.errors if m.startswith("handle_batch raised ValueError")]
    lines = failed_lines(_without_tracebacks(logs))
    assert 1 <= len(tracebacks) <= len(lines)  # the listener's traceback, once per tenure at most
    assert "Traceback" in tracebacks[0] and "poison" in tracebacks[0]
    assert len({line["token"] for line in lines}) == len(lines), "one ERROR per failed tenure"
    for identity in "ab":
        cooldowns = [float(x["cooldown"]) for x in lines if x["identity"] == identity]
        assert len(cooldowns) >= 2
        assert all(c >= 0.8 for c in cooldowns)  # max(ttl, 1 s) less the jitter: no tight loop
        assert cooldowns[1] > cooldowns[0], f"the cooldown does not grow: {cooldowns}"
    # Nothing after the poison event was handled, and nothing before it was lost.
    handled = {e["documentKey"]["_id"] for listener in listeners for _k, _t, e in listener.handled}
    assert 3 not in handled and {0, 1, 2} <= handled


def test_a_stale_writer_resigns_and_a_later_tenure_goes_on(scene: Scene) -> None:
    listener = scene.listener("s")
    runner = scene.runner(listener)
    runner.start()
    try:
        wait_state(runner, "streaming")
        first = runner.status().fencing_token
        assert first is not None
        # Another writer claims with a newer token (a successor the lease store forgot).
        scene.store.claim(runner.name, first + 1, "intruder", listener.deployment())
        scene.coll("s").insert_one({"_id": 1})
        wait_until(
            lambda: (
                (runner.status().fencing_token or 0) > first + 1
                and runner.status().state == "streaming"
            ),
            15,
            what="a newer tenure streaming",
        )
        scene.coll("s").insert_one({"_id": 2})
        wait_until(lambda: len(listener.keys()) >= 2, 10, what="handled after the refusal")
        status = runner.status()
    finally:
        runner.stop()
    assert status.ready and status.failure is None
    tokens = [cp.fencing_token for cp in scene.store.accepted]
    assert first in tokens and max(tokens) > first + 1


def test_a_store_ahead_of_every_token_is_a_failure_not_a_loop(scene: Scene) -> None:
    listener = scene.listener("t")
    scene.store.claim(listener.lease_name, 10**15, "from-another-world", listener.deployment())
    runner = scene.runner(listener)
    with resigned(scene, runner) as logs:
        status = runner.status()
    assert not status.ready and status.failure is not None and "stale writer" in status.failure
    assert str(10**15) in status.failure
    assert len(failed_lines(logs)) == status.failed_tenures


def test_another_deployments_checkpoint_fails_the_tenure_naming_both(scene: Scene) -> None:
    owner = scene.listener("orders", name="shared")
    scene.store.claim("shared", 1, "owner", owner.deployment())
    runner = scene.runner(scene.listener("invoices", name="shared"))
    with resigned(scene, runner):
        status = runner.status()
    assert status.failure is not None and "ConfigurationError" in status.failure
    assert f"{scene.db}.orders" in status.failure and f"{scene.db}.invoices" in status.failure
    assert status.last_outcome is not None and not status.last_outcome.retryable
    assert scene.store.load_deployment("shared") == owner.deployment()


def test_a_resync_cut_short_is_finished_by_the_next_tenure(scene: Scene) -> None:
    """The resync is marked next to the checkpoint before its copy starts: the next tenure
    resyncs (resuming the copy's own progress, which never shows the mark) instead of resuming
    from the checkpoint into a sink that still lacks what it lost."""
    listener = LosesItsSinkOnce(database=scene.db, collection="r")
    runner = scene.runner(listener)
    runner.start()
    try:
        wait_state(runner, "streaming")
        scene.coll("r").insert_one({"_id": "gone"})
        wait_until(lambda: len(listener.copies) >= 3, 30, what="a later tenure's resync")
        status = wait_recovered(runner)
    finally:
        runner.stop()
    (first, none), (cut, _), (finished, progress) = listener.copies
    assert none is None and first == cut < finished
    assert progress == {"copied": 1}  # the cut copy's own progress, without the mark
    assert status.sink_lost == 2 and status.failure is None
    assert scene.store.load_progress(runner.name) is None  # the mark cleared after the copy

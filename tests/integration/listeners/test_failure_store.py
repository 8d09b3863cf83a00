"""The checkpoint store failing under a leader (SecantusDB fail points on ``findAndModify``, the
claim at tenure start): a timeout is retried in place within ``failure_budget`` and then ends the
tenure (retryable), and the replica is ready again once a later tenure streams; a refused
authentication ends the tenure at once (not retryable). Either way the lease is released."""

from __future__ import annotations

from singleton.service.dev.embedded import MongoServer
from tests.integration.listener_support import (
    Scene,
    failed_lines,
    resigned,
    set_fail_point,
    wait_recovered,
)


def test_a_checkpoint_timeout_is_retried_then_fails_then_recovers(
    faulty_mongo: MongoServer, unique: str
) -> None:
    scene = Scene.on(faulty_mongo.url, unique)
    runner = scene.runner(scene.listener("c"), failure_budget=0.5, reconnect_backoff=0.05)
    with resigned(scene, runner, failCommands=["findAndModify"], errorCode=50) as logs:  # MaxTimeMS
        failed = runner.status()
        set_fail_point(scene.client, "off")
        recovered = wait_recovered(runner)
    assert failed.last_outcome is not None
    assert (failed.last_outcome.kind, failed.last_outcome.retryable) == ("failed", True)
    assert failed.failure is not None and "still failing" in failed.failure
    assert failed.reconnects >= 2  # retried in place first
    assert recovered.leader and recovered.failure is None
    assert len(failed_lines(logs)) == failed.failed_tenures >= 1


def test_an_authentication_failure_fails_at_once(faulty_mongo: MongoServer, unique: str) -> None:
    scene = Scene.on(faulty_mongo.url, unique)
    runner = scene.runner(scene.listener("c"))
    # errorCode 18: AuthenticationFailed
    with resigned(scene, runner, failCommands=["findAndModify"], errorCode=18) as logs:
        status = runner.status()
    assert status.last_outcome is not None
    assert (status.last_outcome.kind, status.last_outcome.retryable) == ("failed", False)
    assert status.failure is not None and "PermissionDeniedError" in status.failure
    assert status.reconnects == 0  # not retried: another try would be refused the same way
    lines = failed_lines(logs)
    assert len(lines) == status.failed_tenures and lines[0]["retryable"] == "False"

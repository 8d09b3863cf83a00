"""Release marks (singleton/lease/notify.py): a release notified after a mark was read ends a
later ``wait_for_release(since=mark)`` at once, even though nobody waited when it came. On the
notifier, on a feed, and on MemoryLeaseBackend."""

from __future__ import annotations

import threading
from collections.abc import Callable

from singleton.lease.notify import ReleaseFeed, ReleaseNotifier
from singleton.testing import MemoryLeaseBackend

LONG = 60.0  # a wait that runs to its timeout fails the test long before


def returns_within(seconds: float, wait: Callable[[], bool]) -> list[bool]:
    """Run ``wait`` on a thread; its result once it returned, or ``[]`` if it still waits after
    ``seconds`` (the thread is a daemon: a failing test does not hang the run)."""
    result: list[bool] = []
    returned = threading.Event()

    def run() -> None:
        result.append(wait())
        returned.set()

    threading.Thread(target=run, name="release-waiter", daemon=True).start()
    returned.wait(seconds)
    return result


def test_notify_moves_the_mark_of_its_name_only() -> None:
    notifier = ReleaseNotifier()
    assert notifier.mark("job") == 0
    notifier.notify("job")
    notifier.notify("job")
    notifier.notify("other")
    assert (notifier.mark("job"), notifier.mark("other")) == (2, 1)


def test_a_wait_since_a_mark_that_moved_returns_true_at_once() -> None:
    notifier = ReleaseNotifier()
    mark = notifier.mark("job")
    notifier.notify("job")  # nobody waits yet: without the mark this release is missed
    assert returns_within(10, lambda: notifier.wait("job", LONG, since=mark)) == [True]
    assert not notifier.has_waiters("job")


def test_a_wait_since_the_current_mark_still_waits() -> None:
    notifier = ReleaseNotifier()
    notifier.notify("job")
    notifier.notify("other")  # another name's release moves nothing here
    assert notifier.wait("job", 0.01, since=notifier.mark("job")) is False
    wake = threading.Event()
    wake.set()
    assert notifier.wait("job", LONG, wake, since=notifier.mark("job")) is False


def test_a_feed_honours_since_before_and_after_it_opened() -> None:
    feed: ReleaseFeed

    def session() -> None:
        feed.opened()
        feed.closed.wait()

    feed = ReleaseFeed("test-feed", "a test feed", session, (OSError,), open_timeout=10)
    try:
        mark = feed.mark("job")
        feed.notify("job")  # not started yet: the mark moved all the same
        assert returns_within(10, lambda: feed.wait("job", LONG, since=mark)) == [True]
        assert feed.wait("job", 0.01) is False  # starts it and waits for it to open
        mark = feed.mark("job")
        feed.notify("job")
        assert returns_within(10, lambda: feed.wait("job", LONG, since=mark)) == [True]
        assert feed.wait("job", 0.01, since=feed.mark("job")) is False
    finally:
        feed.close(10)


def test_memory_backend_a_release_between_mark_and_wait_is_not_missed() -> None:
    backend = MemoryLeaseBackend()
    lease = backend.try_acquire("job", "a/1", 30)
    assert lease is not None
    mark = backend.release_mark("job")  # as a candidate reads it before its contend
    assert backend.try_acquire("job", "b/1", 30) is None  # that contend fails
    assert backend.release(lease)  # the holder releases before the candidate waits
    assert backend.release_mark("job") > mark
    result = returns_within(10, lambda: backend.wait_for_release("job", LONG, since=mark))
    assert result == [True], "the wait missed a release that came before it began"
    # A mark read after the release does not count it again.
    assert backend.wait_for_release("job", 0.01, since=backend.release_mark("job")) is False


def test_memory_backend_expiry_and_refused_releases_move_no_mark() -> None:
    backend = MemoryLeaseBackend()
    lease = backend.try_acquire("job", "a/1", 30)
    assert lease is not None
    mark = backend.release_mark("job")
    backend.expire("job")  # a crashed holder: nobody is told
    assert backend.release(lease) is False
    assert backend.release_mark("job") == mark

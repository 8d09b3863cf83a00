"""The Membership contract (singleton/membership.py), against every lease backend's store."""

from __future__ import annotations

import pytest

from singleton.errors import ConfigurationError
from singleton.lease.contract import LeaseBackend
from singleton.service.dev.embedded import wait_until


def test_heartbeat_makes_a_member_live_with_its_info(backend: LeaseBackend) -> None:
    m = backend.membership()
    assert m.members("g") == []
    m.heartbeat("g", "b", 30, {"held": 2, "leases": "4"})
    m.heartbeat("g", "a", 30, {})
    live = m.members("g")
    assert [x.identity for x in live] == ["a", "b"]
    assert live[1].info == {"held": "2", "leases": "4"}
    assert live[0].info == {}
    assert all(0 < x.ttl_remaining <= 30 for x in live)


def test_a_heartbeat_replaces_info_and_extends(backend: LeaseBackend) -> None:
    m = backend.membership()
    m.heartbeat("g", "a", 1, {"held": 1})
    m.heartbeat("g", "a", 30, {"held": 3})
    (only,) = m.members("g")
    assert only.info == {"held": "3"}
    assert only.ttl_remaining > 1


def test_groups_are_apart_and_leave_drops_at_once(backend: LeaseBackend) -> None:
    m = backend.membership()
    m.heartbeat("g", "a", 30, {})
    m.heartbeat("h", "a", 30, {})
    m.leave("g", "a")
    assert m.members("g") == []
    assert [x.identity for x in m.members("h")] == ["a"]
    m.leave("g", "nobody")  # leaving twice, or never joined, is not an error


def test_a_member_expires_on_the_store_clock(backend: LeaseBackend) -> None:
    m = backend.membership()
    m.heartbeat("g", "short", 0.3, {})
    m.heartbeat("g", "long", 60, {})
    wait_until(lambda: [x.identity for x in m.members("g")] == ["long"], 10, what="short expired")
    m.heartbeat("g", "short", 60, {})  # back again after expiry
    assert [x.identity for x in m.members("g")] == ["long", "short"]


def test_bad_arguments_name_the_value(backend: LeaseBackend) -> None:
    m = backend.membership()
    with pytest.raises(ConfigurationError, match="ttl"):
        m.heartbeat("g", "a", 0, {})
    with pytest.raises(ConfigurationError, match=r"'a\.b'"):
        m.heartbeat("g", "a", 1, {"a.b": 1})
    with pytest.raises(ConfigurationError, match="''"):
        m.members("")

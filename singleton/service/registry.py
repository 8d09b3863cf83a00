"""What the service can build, by name: lease backends, checkpoint stores, listeners, jobs.

The one module that names the core's backends and the listeners' classes together (the layers
below never import the service). Adding a lease backend is one entry in :data:`BACKENDS`; adding
a sink is one entry in :data:`LISTENERS`. Names resolve kombu-style: an alias, or
``"pkg.module:Attr"`` for a user's own class (:func:`~singleton.service.imports.resolve`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from listeners.base import ChangeStreamListener
from listeners.checkpoints.stores import CheckpointStore, MongoCheckpointStore, RedisCheckpointStore
from listeners.elasticsearch import ElasticsearchSync
from listeners.logging import LoggingListener
from singleton.errors import ConfigurationError
from singleton.lease.contract import LeaseBackend
from singleton.lease.mongo import MongoLeaseBackend
from singleton.lease.redis import RedisLeaseBackend
from singleton.service.imports import resolve

if TYPE_CHECKING:
    from singleton.service.config import Config


@dataclass(frozen=True)
class ListenerKind:
    """A listener class and the service settings it takes when its table does not set them
    (listener option -> ``Config`` attribute, or ``"lease.ttl"``)."""

    cls: type[ChangeStreamListener]
    service_options: Mapping[str, str] = field(default_factory=dict)


#: alias -> listener kind
LISTENERS: dict[str, ListenerKind] = {
    "elasticsearch": ListenerKind(
        ElasticsearchSync,
        # ttl sizes the index's gc_deletes from the lease, so a deposed leader's late delete is
        # still remembered when it arrives.
        {"es": "es_url", "api_key": "es_api_key", "ca_certs": "es_ca_certs", "ttl": "lease.ttl"},
    ),
    "logging": ListenerKind(LoggingListener),
}

#: backend name -> ``factory(url, namespace)``
BACKENDS: dict[str, tuple[str, Callable[[str, str], LeaseBackend]]] = {
    "redis": ("redis_url", lambda url, ns: RedisLeaseBackend(url, namespace=ns)),
    "mongo": ("mongo_url", lambda url, ns: MongoLeaseBackend(url, database=ns)),
}


def make_backend(config: Config) -> LeaseBackend:
    """The lease backend named by ``config.backend`` (the caller owns it)."""
    try:
        url_key, factory = BACKENDS[config.backend]
    except KeyError:
        raise ConfigurationError(
            f"backend must be one of {', '.join(BACKENDS)}, got {config.backend!r}"
        ) from None
    return factory(getattr(config, url_key), config.namespace)


def make_checkpoint_store(
    config: Config, mongo_client: Any, *, unsafe_disable_fencing: bool = False
) -> CheckpointStore:
    """The checkpoint store named by ``config.checkpoint_store`` (the caller owns it; a Mongo
    store shares ``mongo_client``, which stays the caller's)."""
    if config.checkpoint_store == "redis":
        return RedisCheckpointStore(
            config.redis_url,
            namespace=config.namespace,
            unsafe_disable_fencing=unsafe_disable_fencing,
        )
    return MongoCheckpointStore(
        mongo_client, database=config.namespace, unsafe_disable_fencing=unsafe_disable_fencing
    )


def listener_kind(spec: str) -> ListenerKind:
    """The :class:`ListenerKind` for an alias or a user's ``"pkg.module:Class"``."""
    found = resolve(spec, LISTENERS, "listener")
    if isinstance(found, ListenerKind):
        return found
    for kind in LISTENERS.values():  # "listeners.elasticsearch:ElasticsearchSync" by path
        if kind.cls is found:
            return kind
    if not (isinstance(found, type) and issubclass(found, ChangeStreamListener)):
        raise ConfigurationError(
            f"listener {spec!r} is {found!r}, not a subclass of listeners.ChangeStreamListener"
        )
    return ListenerKind(found)


def job_function(spec: str) -> Callable[..., Any]:
    """The function a ``[[jobs]]`` table names (``"pkg.module:function"``), called as
    ``function(ctx)``."""
    found = resolve(spec, {}, "job")
    if not callable(found) or isinstance(found, type):
        raise ConfigurationError(f"job {spec!r} is {found!r}, not a function taking ctx")
    return found  # type: ignore[no-any-return]

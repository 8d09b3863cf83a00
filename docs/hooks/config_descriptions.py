"""What each ``singleton.toml`` key means, for the keys whose code carries no ``#:`` comment (and
a few whose comment speaks to a maintainer rather than a user). The configuration reference is
generated from the code (``reference.py``); this only adds the sentence. A key missing here and
in the code, or described here but gone from the code, fails ``mkdocs build --strict`` and
``tests/unit/test_docs.py``.

Sections: ``top`` (top-level keys), ``lease`` (``[lease]``), ``listeners`` (the service's keys of
a ``[[listeners]]`` table), ``options`` (every listener's options), ``elasticsearch`` (the
options of ``use = "elasticsearch"``), ``collections`` (a ``[listeners.collections.<name>]``
table, whose meanings are otherwise read from the table in
``listeners/elasticsearch/shape/collections.py``'s docstring), ``jobs`` (``[[jobs]]``).
"""

from __future__ import annotations

DESCRIPTIONS: dict[str, dict[str, str]] = {
    "top": {
        "backend": "The lease store: `redis` or `mongo`.",
        "redis_url": 'Redis for leases (with `backend = "redis"`), release notifications and'
        " the Redis checkpoint store: `redis://`, `rediss://`, `redis+sentinel://` or"
        " `rediss+sentinel://`; credentials in the URL, percent-encoded.",
        "mongo_url": "The MongoDB the listeners stream from; it also holds the checkpoints"
        ' (`checkpoint_store = "mongo"`), the dead letters and, with `backend = "mongo"`,'
        " the leases.",
        "es_url": "Elasticsearch for `elasticsearch` listeners that set no `es` of their own;"
        " several nodes comma-separated.",
        "es_api_key": "An Elasticsearch API key (a secret: never shown), for `elasticsearch`"
        " listeners that set no `api_key`.",
        "es_ca_certs": "A CA bundle (PEM file) to trust for Elasticsearch over TLS.",
        "namespace": "Prefix of every lease, member and checkpoint key in Redis, and the MongoDB"
        " database of leases, checkpoints and dead letters.",
        "identity": "This replica's name in leases, heartbeats and `singleton status` (default:"
        " host-pid); no `/`.",
        "checkpoint_store": "Where resume tokens are saved: `mongo` (the streamed MongoDB) or"
        " `redis` (the Redis of `redis_url`: faster handovers where MongoDB is slow to write).",
        "metrics_address": "`HOST:PORT` for `/metrics`, `/healthz`, `/readyz` and `/status`"
        " (port 0: a free one, logged at start-up); unset or `off`: none.",
        "log_format": "`text` or `json` (one object per line).",
        "log_level": "`TRACE`, `DEBUG`, `INFO`, `SUCCESS`, `WARNING`, `ERROR` or `CRITICAL`.",
        "shutdown_timeout": "Seconds a SIGTERM gives the whole stop (every drain, checkpoint and"
        " release) before the process exits anyway.",
        "drain_timeout": "Seconds a planned handover (SIGTERM, rotation) gives the act in hand,"
        " the sink's requests in flight and the final checkpoint write before it releases anyway"
        " (capped by the lease's release timeout, at most `shutdown_timeout`): shorter hands over"
        " faster when a store or sink stalls, and the successor replays more.",
        "balance": "Spread leases over the live replicas (at most `ceil(leases / replicas)`"
        " each); `false`: every replica contends for every lease.",
    },
    "lease": {
        "ttl": "Seconds a lease lasts without renewal: a crashed leader's successor starts at"
        " most this long after the crash.",
        "renew_interval": "Seconds between renewals (unset: `ttl / 3`).",
        "renew_deadline": "Seconds after the last confirmed renewal at which a leader stops"
        " acting, on its monotonic clock (unset: `2 * ttl / 3`); `ttl > renew_deadline > 1.2 x"
        " renew_interval`.",
        "retry_interval": "The longest a follower waits between two contends while the holder"
        " keeps renewing (it contends again at the lease's expiry, or when a release wakes it).",
        "max_tenure": "Seconds after which a leader hands its lease over the planned way"
        " (rotation); unset: never. At least 2 x ttl.",
        "cooldown": "Seconds a replica that resigned or handed a lease over sits out before it"
        " contends again (unset: `retry_interval`).",
    },
    "listeners": {
        "use": 'The listener: an alias (`elasticsearch`, `logging`) or `"pkg.module:Class"`'
        " (a `ChangeStreamListener` subclass, imported from `--app-dir`).",
        "partitions": "Split the stream in K (1 to 1024), each partition its own lease"
        " `<name>.<i>-of-<K>` and checkpoint.",
        "prefer": "Replica identities that should hold this listener's leases while they are live.",
        "min_tenure": "Seconds a lease stays put before balancing may move it (rotation and"
        " crashes are not held back).",
    },
    "options": {
        "database": "The database to watch (required, here or on the class).",
        "pipeline": "Aggregation stages the server runs on the change stream (`$match`...).",
        "full_document": "The change stream's `fullDocument` mode: `updateLookup` gives updates"
        " the whole document.",
        "batch_size": "Events per batch at most; a batch also goes out after `max_batch_wait`"
        " or once the stream has caught up.",
        "on_history_lost": "When the saved position fell off the oplog (or the checkpoint"
        " vanished): `fail`, `resync` (with an `initial_sync`) or `resume_from_now` (the gap"
        " recorded).",
    },
    "elasticsearch": {
        "es": "Elasticsearch URL (several: a list or comma-separated, one node pool); in the"
        " library also an `elasticsearch.Elasticsearch` client (which stays yours).",
        "api_key": "An API key (a secret: never shown).",
        "basic_auth": "`[user, password]`; or put them in the URL, percent-encoded.",
        "ca_certs": "TLS: the CA bundle to trust (PEM file).",
        "client_cert": "TLS: a client certificate (PEM file).",
        "client_key": "TLS: the client certificate's key (PEM file).",
        "request_timeout": "Seconds one request to Elasticsearch may take.",
        "transform": '`"pkg.module:function"` called with each document before it is indexed'
        " (returning the source to index).",
        "mappings": "Index mappings for the indexes it creates.",
        "settings": "Index settings for the indexes it creates (`gc_deletes` is set from the"
        " lease).",
        "target_bulk_seconds": "With `adaptive_batch`, a bulk request slower than this halves"
        " the batch.",
        "bulk_bytes": "A bulk request goes out at this many bytes at most.",
        "flush_interval": "Seconds after its first item a bulk request goes out anyway.",
        "window_bytes": "Bytes of bulk requests in flight at most.",
        "backoff_base": "Seconds of the first retry of a failing item (doubling).",
        "backoff_max": "The longest backoff between two retries, in seconds.",
        "ttl": "The lease ttl, which sizes the index's `gc_deletes` so that a deposed leader's"
        " late delete is still remembered when it arrives.",
        "gc_safety_factor": "`gc_deletes = max(60 s, ceil(gc_safety_factor * (ttl +"
        " request_timeout)))`.",
        "dead_letters": "In the library, a `DeadLetterStore` or anything with"
        " `put(letters, ctx)`; default: the runner's, else `<namespace>.dead_letters`.",
        "copy_batch_size": "Documents read per batch by the initial sync and resyncs.",
        "on_history_lost": "As above, but `resync` by default: a mirror can always be rebuilt.",
        "collections": "Several collections of `database`, each with its own rules (filter,"
        " fields, routing, index), instead of `collection`: one stream, one lease, one"
        " checkpoint. See [a shaped index](../how-to/shaped-index.md).",
        "batch_size": "Events per stream batch: one batch fills one bulk request"
        " (`bulk_actions`); the ceiling of the adaptive batch size.",
        "sample_size": "Random documents of each collection that every sampled check"
        " (`sample_interval`) compares with the index.",
    },
    "collections": {
        "relate": "Related documents embedded in each document, kept exact when either side"
        " changes: a list of `{ from, local or foreign, as, many, sort, fields, relate }`"
        " (a `relate` within: the related document's own, two levels at most; `local`: this"
        " document's field holds the related `_id`; `foreign`: the related documents' field"
        " holds this `_id`). See [related documents](../how-to/related-documents.md).",
    },
    "jobs": {
        "use": 'The job: `"pkg.module:function"`, called as `function(ctx)`; an `async def`'
        " one is awaited.",
        "name": "The job's lease name (unique).",
        "every": "Fire every this many seconds, counted from 2000-01-01T00:00Z (all replicas"
        " agree); or `cron`.",
        "cron": "A crontab of 5 fields, in UTC, day of week from Sunday (0 or 7); or `every`.",
        "coalesce": "`false`: every missed fire time runs once; `true`: they run once in all.",
        "misfire_grace": "Seconds a late fire time may still run.",
        "prefer": "Replica identities that should hold this job's lease while they are live.",
        "min_tenure": "Seconds the job's lease stays put before balancing may move it.",
    },
}

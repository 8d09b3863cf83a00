"""Leases and what lives beside them in one store: a contract per capability (``leases``,
``facts``, ``fires``, ``membership``; ``contract.LeaseBackend`` is all of them), their timings,
release notifications, and the Redis and MongoDB stores."""

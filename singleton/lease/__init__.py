"""Leases: the contracts, their timings, and the Redis and MongoDB stores."""

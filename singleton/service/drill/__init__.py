"""``singleton drill``: break the leader every way we know, prove nothing was lost, draw it."""

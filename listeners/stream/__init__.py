"""Reading a change stream: where it starts, resume tokens, large events, partitions."""

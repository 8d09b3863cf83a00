"""MongoDB and Redis clients, error tables and cluster time: one place each."""

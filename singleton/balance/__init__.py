"""Balance: who is alive (membership), the rules that spread leases over the live replicas
(machine, no I/O) and the heartbeat thread that runs them (balancer)."""

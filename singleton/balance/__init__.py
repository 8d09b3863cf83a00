"""Balance: who is alive (membership) and how leases spread over the live replicas."""

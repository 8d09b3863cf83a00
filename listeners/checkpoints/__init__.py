"""Checkpoints: the contract, the fenced stores, when to save, and the marker."""

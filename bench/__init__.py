"""Benchmarks. Each ``bench/<name>.py`` has ``main() -> dict``; ``python -m bench`` runs them all
and prints one JSON document ``{"<name>": main(), ...}``."""

"""A shaped index: which collections feed which indexes, and how each document is shaped
(filter, field rules, routing)."""

"""Change-stream listeners that run under a singleton Elector."""

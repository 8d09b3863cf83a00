"""Lease backends. Import the concrete classes from :mod:`singleton`."""

"""Servers on this machine for trying singleton: embedded servers, demo, dev-servers."""

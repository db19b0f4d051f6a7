"""Locust load tests for a running Quire stack (see README.md)."""

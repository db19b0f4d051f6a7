"""Routing policies on the real local stack (`make bench-routing`)."""

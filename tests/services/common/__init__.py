"""Tests of services.common."""

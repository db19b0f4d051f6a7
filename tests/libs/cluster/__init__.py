"""Tests of quire.cluster."""

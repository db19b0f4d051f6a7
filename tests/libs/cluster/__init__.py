"""Tests of quire.cluster (routing policy and Redis records)."""

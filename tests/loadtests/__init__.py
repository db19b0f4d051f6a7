"""Tests of loadtests/ (the workload; the Locust run itself is tests/integration/test_locust_smoke.py)."""

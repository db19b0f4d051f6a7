"""The local stack: which processes `make up` starts, with which flags (one source of truth)."""

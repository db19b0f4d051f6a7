"""Quire: paged-KV-cache LLM serving."""

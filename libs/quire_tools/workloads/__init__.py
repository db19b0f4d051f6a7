"""Benchmark workloads: ShareGPT conversations (vLLM's sampling rule) and synthetic lengths."""

"""The router's policies against a model of many executors (`python -m benchmarks.routing_sim`)."""

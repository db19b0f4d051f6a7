"""Paged-attention and KV-cache kernels: Triton for CUDA, plain torch for CPU and as oracle."""

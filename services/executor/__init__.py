"""The executor service: model weights, the paged KV cache and the engine step loop, served
as quire.v1.Executor over gRPC. Run with `python -m services.executor --help`."""

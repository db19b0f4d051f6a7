"""Fault injection, a leak soak and overload against a real stack: `make chaos`.

Every scenario starts its own stack (Redis, memory manager, executors, router) on free
ports, drives steady load with async HTTP clients (streaming and not, n>1, stop strings,
client disconnects) and injects one fault. Each request ends in exactly one bucket:

- completed: 200 and the whole response (a stream up to ``[DONE]`` without an error event)
- failed_clean: a clear error: an error status with an OpenAI error object (429/503 with
  Retry-After), or an SSE error event
- hung: neither within the deadline
- lost: accepted (200 headers) but the stream ended without ``[DONE]`` and without an error
  event, or a non-streaming response whose connection dropped
- disconnected: the client went away on purpose (an abort), not a failure

`blocks_leaked` is the sum of kv_blocks_used over live executors once the cluster is idle.
The results go to bench/results/chaos.json; the exit status is 1 unless hung, lost and
blocks_leaked are 0 for every fault. `--quick` runs the same scenarios with small counts.
"""

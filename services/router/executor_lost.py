"""An executor lost mid-stream: the one condition on which the router migrates a stream.

`ExecutorLost` is raised by `ExecutorStream.responses()` (services/router/dispatch.py), after
the stream's first response, when its executor can no longer be counted on to finish it:

- the call ends with gRPC UNAVAILABLE (the process died, the connection reset, its server
  stopped, or the executor ended the stream on purpose: a drain whose grace period ran out
  ends its streams with UNAVAILABLE), or with CANCELLED that the router did not ask for;
- the call ends (EOF) before a message with `finished = true`;
- someone declared it lost: `ExecutorStream.lose(reason)` for one stream, or
  `Dispatcher.lose_executor(executor_id, reason)` for every open stream on an executor (which
  also marks it down, so nothing is routed there for `executor_down_s`). The stall watch
  (services/router/stall_watch.py) calls it for an executor this router waits on whose
  liveness record shows no progress, or is gone. The pending read is cancelled, and the call
  with it (the executor aborts the request if it still can).

The generation that owns the stream (services/router/generation.py) catches it and continues
each of the stream's unfinished outputs on another executor as a continuation
(`GenerateRequest.continuation` in protos/services/rpc/executor.proto: the prompt, the tokens
sent so far, the same parameters), at most `max_migrations` times per HTTP request (a router
setting). Past that, or when no executor takes a continuation, the client's stream ends with
the error event as before (503 `executor_unavailable`). Errors that belong to the request
(INVALID_ARGUMENT, RESOURCE_EXHAUSTED, DEADLINE_EXCEEDED, INTERNAL from a failed engine step)
are not losses: they end the stream as they always did.
"""

from __future__ import annotations

import grpc

from services.router.errors import ApiError

# gRPC codes that mean "the executor went away", not "the request failed".
LOST_CODES = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED})


class ExecutorLost(Exception):
    """The executor of an open stream is gone; the stream's outputs may continue elsewhere."""

    def __init__(self, executor_id: str, reason: str) -> None:
        super().__init__(f"executor {executor_id} lost: {reason}")
        self.executor_id = executor_id
        self.reason = reason

    def api_error(self) -> ApiError:
        """What the client sees when the stream cannot be migrated (any more)."""
        return ApiError(
            503, f"executor {self.executor_id} is unavailable", code="executor_unavailable"
        )

"""An executor's role (--role) and what a prefill executor does with a new request.

Prefill/decode disaggregation, as an option: an executor started with `--role prefill` runs a
new request's prompt and the first token of each output, then ends each output that had more
to go with the finish reason `handoff` (services.common.wire.executor.HANDOFF) instead of `length`; the router continues
every handed-off output on a decode executor (`--role decode`) as a continuation
(`GenerateRequest.continuation`), which finds the prompt's full blocks in the prefix cache of
the prefill executor and pulls them (the memory manager's pull offers) instead of computing
them. `both`, the default, takes every phase. Continuations are always served in full, so a
cluster without decode executors still finishes every request (the router sends the
continuation to whoever takes it).

The role changes what the engine is asked for, never how it computes: the prefill run is the
request with max_tokens 1, and the continuation samples position by position as the
uninterrupted request would (seeded draws keyed on the absolute position).
"""

from __future__ import annotations

from dataclasses import replace

from quire.sampling_params import SamplingParams
from services.common.wire.executor import HANDOFF
from services.rpc import executor_pb2 as pb


def prefill_params(
    params: SamplingParams, num_prompt_tokens: int, max_model_len: int
) -> SamplingParams | None:
    """What a prefill executor runs a new request with (one token per output), or None when
    that first token ends every output anyway (max_tokens 1, or the context is full there)."""
    if params.max_tokens <= 1 or num_prompt_tokens + 1 >= max_model_len:
        return None
    return replace(params, max_tokens=1)


def mark_handoffs(response: pb.GenerateResponse) -> None:
    """Rename the `length` finishes of a prefill run (its max_tokens of 1) to `handoff`."""
    for output in response.outputs:
        if output.finish_reason == "length":
            output.finish_reason = HANDOFF

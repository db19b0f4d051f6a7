"""The executor contract (quire.v1.Executor) in dataclasses: sampling params, step deltas, load.

Both ends use this one module: the router encodes `SamplingParams` and decodes the stream's
`GenerateResponse`s into `RequestDelta`s; the executor does the opposite. Text never crosses
this boundary: stop strings, `include_stop_str_in_output` and `skip_special_tokens` stay with
the router's output processor.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from quire.cluster.redis_keys import ExecutorLoad
from quire.engine.inputs import Continuation
from quire.outputs import Logprob, RequestDelta, SequenceDelta
from quire.sampling_params import FLOAT_FIELDS, SamplingParams
from quire.structured_params import StructuredOutputParams
from services.rpc import executor_pb2 as pb

# Copied as they are; 0 / False / 0.0 on the wire are the engine's defaults too.
_PLAIN_FIELDS = (
    "min_p",
    "ignore_eos",
    "presence_penalty",
    "frequency_penalty",
)
# `optional` on the wire: unset means the engine's default.
_OPTIONAL_FIELDS = (
    "temperature",
    "top_p",
    "repetition_penalty",
    "logprobs",
    "seed",
    "prompt_logprobs",
)


def params_to_proto(params: SamplingParams) -> pb.SamplingParams:
    """The engine-side part of `params` as the wire message (text settings left out)."""
    wire = pb.SamplingParams(n=params.n, max_tokens=params.max_tokens, top_k=params.top_k or 0)
    wire.stop_token_ids.extend(params.stop_token_ids)
    if params.logit_bias:
        wire.logit_bias.update(params.logit_bias)
    for name in _PLAIN_FIELDS:
        setattr(wire, name, getattr(params, name))
    for name in _OPTIONAL_FIELDS:
        value = getattr(params, name)
        if value is not None:
            setattr(wire, name, value % 2**64 if name == "seed" else value)
    if params.structured is not None:
        wire.structured.CopyFrom(structured_to_proto(params.structured))
    return wire


def structured_to_proto(spec: StructuredOutputParams) -> pb.StructuredOutput:
    """The one constraint of `spec` in the wire's oneof."""
    if spec.json is not None:
        return pb.StructuredOutput(json_schema=str(spec.json))
    if spec.regex is not None:
        return pb.StructuredOutput(regex=spec.regex)
    if spec.choice is not None:
        return pb.StructuredOutput(choice=pb.ChoiceList(choices=list(spec.choice)))
    if spec.grammar is not None:
        return pb.StructuredOutput(grammar=spec.grammar)
    if spec.structural_tag is not None:
        return pb.StructuredOutput(structural_tag=str(spec.structural_tag))
    return pb.StructuredOutput(json_object=True)


def structured_from_proto(msg: pb.StructuredOutput) -> StructuredOutputParams:
    """StructuredOutputParams from the wire; ValueError when the oneof is unset or bad."""
    kind = msg.WhichOneof("spec")
    if kind == "json_schema":
        return StructuredOutputParams(json=msg.json_schema)
    if kind == "regex":
        return StructuredOutputParams(regex=msg.regex)
    if kind == "choice":
        return StructuredOutputParams(choice=list(msg.choice.choices))
    if kind == "grammar":
        return StructuredOutputParams(grammar=msg.grammar)
    if kind == "structural_tag":
        return StructuredOutputParams(structural_tag=msg.structural_tag)
    if kind == "json_object" and msg.json_object:
        return StructuredOutputParams(json_object=True)
    raise ValueError("structured output sets no constraint")


def params_from_proto(msg: pb.SamplingParams) -> SamplingParams:
    """The engine's SamplingParams; unset fields take its defaults. ValueError if invalid.

    `n` and `max_tokens` are plain uint32 on the wire, so 0 means unset (1 and 16); `top_k`
    0 disables top-k. NaN or infinite floats are refused here: no range check catches them all.
    """
    for name in FLOAT_FIELDS:
        value = getattr(msg, name)
        if not math.isfinite(value):
            raise ValueError(f"{name} must be a finite number, got {value}")
    defaults = SamplingParams()
    values: dict[str, object] = {
        "n": msg.n or defaults.n,
        "max_tokens": msg.max_tokens or defaults.max_tokens,
        "top_k": msg.top_k or None,
        "stop_token_ids": list(msg.stop_token_ids),
        # SamplingParams checks the range (NaN and infinities included).
        "logit_bias": dict(msg.logit_bias) or None,
    }
    for name in _PLAIN_FIELDS:
        values[name] = getattr(msg, name)
    for name in _OPTIONAL_FIELDS:
        values[name] = getattr(msg, name) if msg.HasField(name) else getattr(defaults, name)
    if msg.HasField("structured"):
        values["structured"] = structured_from_proto(msg.structured)
    return SamplingParams(**values)  # type: ignore[arg-type]


def continuation_from_proto(request: pb.GenerateRequest) -> Continuation | None:
    """The output a Generate call continues, None for a new request."""
    if not request.HasField("continuation"):
        return None
    msg = request.continuation
    return Continuation(msg.output_index, tuple(msg.token_ids), msg.cumulative_logprob)


def delta_to_proto(
    delta: RequestDelta,
    num_top_logprobs: int,
    prompt_token_ids: list[int] | None = None,
    num_prompt_top_logprobs: int = 0,
) -> pb.GenerateResponse:
    """One step's delta of a request as its Generate stream's next message.

    Prompt logprobs entry j scores prompt token j + 1 (`prompt_token_ids` names them).
    """
    msg = pb.GenerateResponse(
        outputs=[_sequence_to_proto(s, num_top_logprobs) for s in delta.outputs],
        finished=delta.finished,
        num_prompt_tokens=delta.num_prompt_tokens,
        num_cached_tokens=delta.num_cached_tokens,
    )
    if delta.prompt_logprobs:
        assert prompt_token_ids is not None, "prompt logprobs need the prompt's token ids"
        for token_id, top in zip(prompt_token_ids[1:], delta.prompt_logprobs, strict=True):
            msg.prompt_logprobs.append(_token_logprobs(token_id, top, num_prompt_top_logprobs))
    return msg


def aborted_response(
    unfinished: Iterable[int], num_prompt_tokens: int, num_cached_tokens: int
) -> pb.GenerateResponse:
    """The last message of a request aborted as a whole (Abort call, drain timeout)."""
    return pb.GenerateResponse(
        outputs=[pb.CompletionDelta(index=i, finish_reason="abort") for i in unfinished],
        finished=True,
        num_prompt_tokens=num_prompt_tokens,
        num_cached_tokens=num_cached_tokens,
    )


# CompletionDelta.finish_reason of an output a prefill executor (--role prefill) ran to its
# first token and hands on: not an end, the router continues it on a decode executor.
HANDOFF = "handoff"


def delta_from_proto(request_id: str, msg: pb.GenerateResponse) -> RequestDelta:
    return RequestDelta(
        request_id=request_id,
        outputs=[_sequence_from_proto(d) for d in msg.outputs],
        finished=msg.finished,
        num_prompt_tokens=msg.num_prompt_tokens,
        num_cached_tokens=msg.num_cached_tokens,
        prompt_logprobs=[_token_logprobs_from_proto(lp) for lp in msg.prompt_logprobs] or None,
    )


def _sequence_to_proto(seq: SequenceDelta, k: int) -> pb.CompletionDelta:
    msg = pb.CompletionDelta(
        index=seq.index,
        token_ids=seq.new_token_ids,
        finish_reason=seq.finish_reason or "",
        cumulative_logprob=seq.cumulative_logprob,
    )
    if seq.stop_reason is not None:
        msg.stop_token_id = seq.stop_reason
    if seq.new_logprobs is not None:
        for token_id, top in zip(seq.new_token_ids, seq.new_logprobs, strict=True):
            msg.logprobs.append(_token_logprobs(token_id, top, k))
    return msg


def _token_logprobs(token_id: int, top: dict[int, Logprob], k: int) -> pb.TokenLogprobs:
    # The engine puts the top-k first, then the chosen token if it was not among them.
    return pb.TokenLogprobs(
        token_id=token_id,
        logprob=top[token_id].logprob,
        rank=top[token_id].rank,
        top=[
            pb.TopLogprob(token_id=t, logprob=lp.logprob, rank=lp.rank)
            for t, lp in list(top.items())[:k]
        ],
    )


def _token_logprobs_from_proto(lp: pb.TokenLogprobs) -> dict[int, Logprob]:
    top = {t.token_id: Logprob(t.logprob, t.rank) for t in lp.top}
    top.setdefault(lp.token_id, Logprob(lp.logprob, lp.rank))
    return top


def _sequence_from_proto(msg: pb.CompletionDelta) -> SequenceDelta:
    logprobs = None
    if msg.logprobs:
        logprobs = [_token_logprobs_from_proto(lp) for lp in msg.logprobs]
    return SequenceDelta(
        index=msg.index,
        new_token_ids=list(msg.token_ids),
        new_logprobs=logprobs,
        cumulative_logprob=msg.cumulative_logprob,
        finish_reason=msg.finish_reason or None,
        stop_reason=msg.stop_token_id if msg.HasField("stop_token_id") else None,
    )


_LOAD_FIELDS = tuple(ExecutorLoad.__dataclass_fields__)


def load_to_proto(load: ExecutorLoad) -> pb.ExecutorLoad:
    return pb.ExecutorLoad(**{name: getattr(load, name) for name in _LOAD_FIELDS})


def load_from_proto(msg: pb.ExecutorLoad) -> ExecutorLoad:
    return ExecutorLoad(**{name: getattr(msg, name) for name in _LOAD_FIELDS})

"""Translation between the wire (quire.v1 protobuf) and the engine's dataclasses.

The engine reports cumulative outputs; the wire carries deltas. `DeltaTracker` remembers
what one stream has sent and turns each cumulative `RequestOutput` into the new part.
"""

from __future__ import annotations

import math

from quire.outputs import CompletionOutput, Logprob, RequestOutput
from quire.sampling_params import SamplingParams
from services.rpc import executor_pb2 as pb


def sampling_params_from_proto(msg: pb.SamplingParams) -> SamplingParams:
    """The engine's SamplingParams; unset fields take its defaults. ValueError if invalid.

    `n` and `max_tokens` are plain uint32 on the wire, so 0 means unset (1 and 16); `top_k`
    0 disables top-k. NaN or infinite floats are refused here: no range check catches them all.
    """
    for name in _FLOAT_FIELDS:
        value = getattr(msg, name)
        if not math.isfinite(value):
            raise ValueError(f"{name} must be a finite number, got {value}")
    defaults = SamplingParams()
    return SamplingParams(
        n=msg.n or defaults.n,
        temperature=msg.temperature if msg.HasField("temperature") else defaults.temperature,
        top_p=msg.top_p if msg.HasField("top_p") else defaults.top_p,
        top_k=msg.top_k or None,
        min_p=msg.min_p,
        seed=msg.seed if msg.HasField("seed") else None,
        max_tokens=msg.max_tokens or defaults.max_tokens,
        stop=list(msg.stop),
        stop_token_ids=list(msg.stop_token_ids),
        ignore_eos=msg.ignore_eos,
        logprobs=msg.logprobs if msg.HasField("logprobs") else None,
        presence_penalty=msg.presence_penalty,
        frequency_penalty=msg.frequency_penalty,
        repetition_penalty=(
            msg.repetition_penalty
            if msg.HasField("repetition_penalty")
            else defaults.repetition_penalty
        ),
        include_stop_str_in_output=msg.include_stop_str_in_output,
        skip_special_tokens=(
            msg.skip_special_tokens
            if msg.HasField("skip_special_tokens")
            else defaults.skip_special_tokens
        ),
    )


_FLOAT_FIELDS = (
    "temperature",
    "top_p",
    "min_p",
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
)


def held_back_len(text: str, stops: list[str]) -> int:
    """Length of the longest suffix of `text` that could still grow into a stop string.

    That text is not streamed yet: if the stop string completes, the engine cuts it off.
    """
    longest = 0
    for stop in stops:
        for k in range(min(len(stop) - 1, len(text)), longest, -1):
            if text.endswith(stop[:k]):
                longest = k
                break
    return longest


def _token_logprobs(token_id: int, top: dict[int, Logprob], k: int) -> pb.TokenLogprobs:
    # The sampler inserts the top-k first, then the sampled token if it was not among them.
    return pb.TokenLogprobs(
        token_id=token_id,
        logprob=top[token_id].logprob,
        top=[
            pb.TopLogprob(token_id=t, logprob=lp.logprob, rank=lp.rank)
            for t, lp in list(top.items())[:k]
        ],
    )


class DeltaTracker:
    """What one Generate stream has sent so far, per output index."""

    def __init__(self, params: SamplingParams) -> None:
        self.stops = list(params.stop)
        self.num_top_logprobs = params.logprobs or 0
        self.num_tokens_sent = [0] * params.n
        self.num_chars_sent = [0] * params.n
        self.is_index_finished = [False] * params.n
        self.texts = [""] * params.n  # latest cumulative text per index
        self.num_cached_tokens = 0

    def _delta(self, out: CompletionOutput) -> pb.CompletionDelta | None:
        i = out.index
        if self.is_index_finished[i]:
            return None
        self.texts[i] = out.text
        new_ids = out.token_ids[self.num_tokens_sent[i] :]
        end = len(out.text)
        if out.finish_reason is None and self.stops:
            end -= held_back_len(out.text, self.stops)
        new_text = out.text[self.num_chars_sent[i] : end]
        if not new_ids and not new_text and out.finish_reason is None:
            return None
        delta = pb.CompletionDelta(
            index=i,
            token_ids=new_ids,
            text=new_text,
            finish_reason=out.finish_reason or "",
            stop_reason="" if out.stop_reason is None else str(out.stop_reason),
        )
        if out.logprobs is not None:
            new_logprobs = out.logprobs[self.num_tokens_sent[i] :]
            delta.logprobs.extend(
                _token_logprobs(t, top, self.num_top_logprobs)
                for t, top in zip(new_ids, new_logprobs, strict=True)
            )
        self.num_tokens_sent[i] = len(out.token_ids)
        self.num_chars_sent[i] = max(self.num_chars_sent[i], end)
        self.is_index_finished[i] = out.finish_reason is not None
        return delta

    def response(self, output: RequestOutput) -> pb.GenerateResponse | None:
        """The delta message for one engine step's cumulative output (None: nothing new)."""
        self.num_cached_tokens = output.num_cached_tokens
        deltas = [d for d in (self._delta(o) for o in output.outputs) if d is not None]
        if not deltas and not output.finished:
            return None
        return pb.GenerateResponse(
            outputs=deltas,
            finished=output.finished,
            num_prompt_tokens=len(output.prompt_token_ids),
            num_cached_tokens=output.num_cached_tokens,
        )

    def aborted(self, num_prompt_tokens: int) -> pb.GenerateResponse:
        """The last message of a request aborted by an Abort call (or a drain timeout).

        Text held back for a possible stop string is released with it.
        """
        deltas = []
        for i, done in enumerate(self.is_index_finished):
            if not done:
                text = self.texts[i][self.num_chars_sent[i] :]
                deltas.append(pb.CompletionDelta(index=i, text=text, finish_reason="abort"))
                self.is_index_finished[i] = True
        return pb.GenerateResponse(
            outputs=deltas,
            finished=True,
            num_prompt_tokens=num_prompt_tokens,
            num_cached_tokens=self.num_cached_tokens,
        )

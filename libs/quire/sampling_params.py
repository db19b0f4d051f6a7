"""SamplingParams: how one request's tokens are chosen and when it stops."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from quire.structured_params import StructuredOutputParams

MAX_LOGPROBS = 20  # most top-k logprobs returned per token
MAX_N = 128  # most parallel samples per request
MAX_STOP_STRINGS = 16
MAX_LOGIT_BIAS = 100.0  # |bias| added to a token's logit (OpenAI's and vLLM's range)
# The float-valued fields: what codecs check for NaN/inf and copy when set.
FLOAT_FIELDS = (
    "temperature",
    "top_p",
    "min_p",
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
)


class ParamError(ValueError):
    """An invalid sampling parameter; `param` names the field (the API's 400 names it too)."""

    def __init__(self, param: str, message: str) -> None:
        super().__init__(message)
        self.param = param


@dataclass
class SamplingParams:
    """Per-request sampling settings (vLLM's names and defaults). Validated on construction.

    `temperature == 0` means greedy. `top_k` of None or 0 disables top-k.
    """

    n: int = 1  # number of output sequences (forked from one prompt, sharing its blocks)
    temperature: float = 1.0  # 0 = greedy
    top_p: float = 1.0  # nucleus mass kept, in (0, 1]
    top_k: int | None = None  # keep the k most likely tokens; None or 0 = all
    min_p: float = 0.0  # drop tokens below min_p * p(most likely), in [0, 1]
    seed: int | None = None  # per-request seed: same seed, same output
    max_tokens: int = 16  # most tokens generated per output sequence
    stop: list[str] = field(default_factory=list)  # stop strings (not included in text)
    stop_token_ids: list[int] = field(default_factory=list)  # extra stop tokens (kept in ids)
    ignore_eos: bool = False  # keep generating past EOS
    logprobs: int | None = None  # top-k logprobs per generated token (plus the sampled one)
    presence_penalty: float = 0.0  # OpenAI-style, over generated tokens, in [-2, 2]
    frequency_penalty: float = 0.0  # OpenAI-style, over generated tokens, in [-2, 2]
    repetition_penalty: float = 1.0  # CTRL-style, over prompt + generated tokens, > 0
    include_stop_str_in_output: bool = False  # keep a matched stop string in the text
    skip_special_tokens: bool = True  # drop special tokens from the text
    # token id -> bias in [-100, 100] added to its logit before sampling (greedy too);
    # -100 bans a token in practice, +100 forces it. None or {} = no bias.
    logit_bias: dict[int, float] | None = None
    # top-k logprobs of every prompt token (plus the prompt token itself), vLLM's extra;
    # None = not computed (the engine then computes logits at the last position only).
    prompt_logprobs: int | None = None
    # The grammar the output must follow, enforced while decoding; None = unconstrained.
    structured: StructuredOutputParams | None = None

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        if not isinstance(self.n, int) or not 1 <= self.n <= MAX_N:
            raise ParamError("n", f"n must be an integer in [1, {MAX_N}], got {self.n!r}")
        if self.temperature < 0:
            raise ParamError("temperature", f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ParamError("top_p", f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k is not None and self.top_k < 0:
            raise ParamError(
                "top_k", f"top_k must be >= 0 (0 or None disables it), got {self.top_k}"
            )
        if not 0 <= self.min_p <= 1:
            raise ParamError("min_p", f"min_p must be in [0, 1], got {self.min_p}")
        if not isinstance(self.max_tokens, int) or self.max_tokens < 1:
            raise ParamError(
                "max_tokens", f"max_tokens must be an integer >= 1, got {self.max_tokens!r}"
            )
        if self.logprobs is not None and not 0 <= self.logprobs <= MAX_LOGPROBS:
            raise ParamError(
                "logprobs", f"logprobs must be in [0, {MAX_LOGPROBS}], got {self.logprobs}"
            )
        for name in ("presence_penalty", "frequency_penalty"):
            if not -2 <= getattr(self, name) <= 2:
                raise ParamError(name, f"{name} must be in [-2, 2], got {getattr(self, name)}")
        if self.repetition_penalty <= 0:
            raise ParamError(
                "repetition_penalty",
                f"repetition_penalty must be > 0, got {self.repetition_penalty}",
            )
        if len(self.stop) > MAX_STOP_STRINGS:
            raise ParamError("stop", f"stop accepts at most {MAX_STOP_STRINGS} strings")
        if any(not isinstance(s, str) or not s for s in self.stop):
            raise ParamError("stop", "stop strings must be non-empty strings")
        if any(not isinstance(t, int) or t < 0 for t in self.stop_token_ids):
            raise ParamError("stop_token_ids", "stop_token_ids must be non-negative integers")
        if self.prompt_logprobs is not None and not (
            isinstance(self.prompt_logprobs, int) and 0 <= self.prompt_logprobs <= MAX_LOGPROBS
        ):
            raise ParamError(
                "prompt_logprobs",
                f"prompt_logprobs must be an integer in [0, {MAX_LOGPROBS}], "
                f"got {self.prompt_logprobs!r}",
            )
        if self.structured is not None and not isinstance(self.structured, StructuredOutputParams):
            raise ParamError("structured", "structured must be a StructuredOutputParams")
        self._check_logit_bias()

    def _check_logit_bias(self) -> None:
        if self.logit_bias is None:
            return
        if not isinstance(self.logit_bias, dict):
            raise ParamError("logit_bias", "logit_bias must be a mapping of token id to bias")
        for token_id, bias in self.logit_bias.items():
            if isinstance(token_id, bool) or not isinstance(token_id, int) or token_id < 0:
                raise ParamError(
                    "logit_bias", f"logit_bias keys must be token ids >= 0, got {token_id!r}"
                )
            if (
                isinstance(bias, bool)
                or not isinstance(bias, int | float)
                or not math.isfinite(bias)
                or abs(bias) > MAX_LOGIT_BIAS
            ):
                raise ParamError(
                    "logit_bias",
                    f"logit_bias values must be numbers in [-{MAX_LOGIT_BIAS:g}, "
                    f"{MAX_LOGIT_BIAS:g}], got {bias!r} for token {token_id}",
                )

    def check_vocab(self, vocab_size: int) -> None:
        """ParamError naming the field if a token id in the params is outside the vocab."""
        for token_id in self.logit_bias or {}:
            if token_id >= vocab_size:
                raise ParamError(
                    "logit_bias",
                    f"logit_bias token id {token_id} is outside the vocabulary (size {vocab_size})",
                )

    @property
    def is_greedy(self) -> bool:
        return self.temperature == 0

    @property
    def has_logit_bias(self) -> bool:
        return bool(self.logit_bias)

    @property
    def has_penalties(self) -> bool:
        return (
            self.presence_penalty != 0
            or self.frequency_penalty != 0
            or self.repetition_penalty != 1.0
        )

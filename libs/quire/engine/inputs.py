"""How a request comes in: its prompt as token ids, the seed of each output it samples, and
what a continuation resumes."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from quire.block.allocator import BlockAllocator
from quire.sampling_params import SamplingParams

Prompt = str | dict[str, Any]


def tokenize_prompt(
    tokenizer: Any, vocab_size: int, prompt: Prompt
) -> tuple[str | None, list[int]]:
    """Prompt text and token ids, or ValueError naming what is wrong with the prompt."""
    if isinstance(prompt, str):
        if not prompt:
            raise ValueError("prompt must not be empty")
        return prompt, list(tokenizer.encode(prompt))
    if isinstance(prompt, dict) and "prompt_token_ids" in prompt:
        ids = prompt["prompt_token_ids"]
        if not isinstance(ids, list | tuple) or not ids:
            raise ValueError("prompt_token_ids must be a non-empty list of token ids")
        if any(not isinstance(t, int) or not 0 <= t < vocab_size for t in ids):
            raise ValueError(f"prompt_token_ids must be integers in [0, {vocab_size})")
        return prompt.get("prompt"), list(ids)
    raise ValueError('prompt must be a string or {"prompt_token_ids": [...]}')


def check_prompt_fits(
    num_prompt_tokens: int,
    max_model_len: int,
    block_size: int,
    allocator: BlockAllocator,
    num_groups: int = 1,
) -> None:
    """ValueError unless the prompt leaves room to generate and fits the KV pool at all
    (`num_groups` blocks per block of tokens: quire.block.window.TableLayout)."""
    if num_prompt_tokens >= max_model_len:
        raise ValueError(
            f"prompt has {num_prompt_tokens} tokens; the model's context is {max_model_len} "
            "tokens and at least one must be left to generate"
        )
    blocks = num_groups * -(-(num_prompt_tokens + 1) // block_size)
    if blocks > allocator.num_blocks:
        raise ValueError(
            f"prompt needs {blocks} KV blocks but the cache holds {allocator.num_blocks}"
        )


def output_seeds(params: SamplingParams, default_seed: int) -> list[int | None]:
    """The seed of each output index, from the request's seed (else `default_seed`); None for
    greedy requests. The sampler keys each draw on (this seed, the token's position), so an
    output's tokens do not depend on what shares its batches, nor on where its earlier tokens
    were computed (a preemption, another executor continuing it)."""
    if params.is_greedy:
        return [None] * params.n
    base = params.seed if params.seed is not None else default_seed
    return [(base * 7919 + index) % (2**63) for index in range(params.n)]


@dataclass(frozen=True)
class Continuation:
    """One output of a request, resumed where an earlier run of it stopped (the wire's
    `GenerateRequest.continuation`): the engine runs that output alone, as output
    `output_index` of a request with the same prompt and params, its first tokens already
    generated. They are output, not prompt (max_tokens, penalties, the grammar and the draws'
    positions count them), so greedy and seeded outputs go on exactly as they would have."""

    output_index: int  # among the original request's params.n outputs (its seed)
    token_ids: tuple[int, ...]  # the output's tokens so far
    cumulative_logprob: float = 0.0  # their logprobs' sum; later deltas count from it

    def check(
        self, params: SamplingParams, num_prompt_tokens: int, max_model_len: int, vocab: int
    ) -> None:
        """ValueError unless this continues an output of `params` that has tokens left."""
        if not 0 <= self.output_index < params.n:
            raise ValueError(
                f"continuation output_index {self.output_index} is not among the request's "
                f"{params.n} outputs"
            )
        if any(not 0 <= t < vocab for t in self.token_ids):
            raise ValueError(f"continuation token ids must be in [0, {vocab})")
        if len(self.token_ids) >= params.max_tokens:
            raise ValueError(
                f"the continued output already has {len(self.token_ids)} of its "
                f"{params.max_tokens} max_tokens"
            )
        if num_prompt_tokens + len(self.token_ids) >= max_model_len:
            raise ValueError("the continued output already fills the model's context")

"""POST /tokenize and /detokenize, as vLLM serves them: the router's own tokenizer and chat
template, the same ones generation uses, so counts match what a completion is charged."""

from __future__ import annotations

from fastapi import APIRouter

from services.router.deps import StateDep
from services.router.errors import bad_request
from services.router.schemas import (
    DetokenizeRequest,
    DetokenizeResponse,
    TokenizeRequest,
    TokenizeResponse,
)

router = APIRouter(tags=["tokenize"])


@router.post("/tokenize")
async def tokenize(body: TokenizeRequest, state: StateDep) -> TokenizeResponse:
    """Token ids of a prompt (or of chat messages through the template), and their count."""
    state.check_model(body.model)
    if body.messages is not None:
        messages = [m.for_template() for m in body.messages]
        tokens = state.prompts.chat_prompt(
            messages,
            add_generation_prompt=body.add_generation_prompt,
            continue_final_message=body.continue_final_message,
        )
        if body.add_special_tokens:
            tokens = _with_special_tokens(state.tokenizer, tokens)
    else:
        assert body.prompt is not None, "the request validator requires one input"
        add_special = True if body.add_special_tokens is None else body.add_special_tokens
        tokens = list(state.tokenizer.encode(body.prompt, add_special_tokens=add_special))
    token_strs = None
    if body.return_token_strs:
        token_strs = [str(t) for t in state.tokenizer.convert_ids_to_tokens(tokens)]
    return TokenizeResponse(
        count=len(tokens), max_model_len=state.max_model_len, tokens=tokens, token_strs=token_strs
    )


@router.post("/detokenize")
async def detokenize(body: DetokenizeRequest, state: StateDep) -> DetokenizeResponse:
    """The text of token ids (special tokens kept, as vLLM decodes them)."""
    state.check_model(body.model)
    vocab_size = state.prompts.vocab_size
    for token_id in body.tokens:
        if not 0 <= token_id < vocab_size:
            raise bad_request(f"token id {token_id} is not in [0, {vocab_size})", "tokens")
    return DetokenizeResponse(prompt=str(state.tokenizer.decode(body.tokens)))


def _with_special_tokens(tokenizer: object, tokens: list[int]) -> list[int]:
    # The tokenizer's own special tokens around the rendered ids (BOS for Llama-style).
    build = getattr(tokenizer, "build_inputs_with_special_tokens", None)
    return list(build(tokens)) if build is not None else tokens

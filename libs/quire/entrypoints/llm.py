"""The offline API in vLLM's shape: `LLM(model=...).generate(prompts, SamplingParams(...))`."""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence
from dataclasses import fields
from typing import Any

from tqdm.auto import tqdm

from quire.config import EngineConfig
from quire.engine.inputs import Prompt
from quire.engine.llm_engine import LLMEngine
from quire.engine.output_processor import OutputProcessor
from quire.engine.stats import EngineStats
from quire.outputs import RequestOutput
from quire.sampling_params import SamplingParams


class LLM:
    """A paged engine in this process. Arguments are EngineConfig's fields."""

    def __init__(self, model: str, **engine_args: Any) -> None:
        """`engine_args` are `EngineConfig`'s fields (block_size, num_kv_blocks, dtype, ...)."""
        unknown = sorted(set(engine_args) - {f.name for f in fields(EngineConfig)})
        if unknown:
            raise ValueError(
                f"unknown engine argument(s) {', '.join(unknown)}; EngineConfig takes "
                + ", ".join(f.name for f in fields(EngineConfig) if f.name != "model")
            )
        self._attach(LLMEngine(EngineConfig(model=model, **engine_args)))

    @classmethod
    def from_engine(cls, engine: LLMEngine) -> LLM:
        """The offline API over an engine built by hand (its own allocator or puller)."""
        llm = cls.__new__(cls)
        llm._attach(engine)
        return llm

    def _attach(self, engine: LLMEngine) -> None:
        self.engine = engine
        self.processor = OutputProcessor(engine.tokenizer)
        self._ids = itertools.count()

    def get_tokenizer(self):  # noqa: ANN201 - a transformers tokenizer
        return self.engine.tokenizer

    def stats(self) -> EngineStats:
        return self.engine.stats()

    def generate(
        self,
        prompts: Prompt | Sequence[Prompt],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        use_tqdm: bool = True,
    ) -> list[RequestOutput]:
        """Run every prompt to completion; outputs come back in input order.

        Every prompt is validated before any is queued, so one bad prompt raises
        ValueError without leaving the others half-run.
        """
        if isinstance(prompts, str | dict):
            prompts = [prompts]
        prompts = list(prompts)
        if sampling_params is None:
            sampling_params = SamplingParams()
        if isinstance(sampling_params, SamplingParams):
            params_list = [sampling_params] * len(prompts)
        else:
            params_list = list(sampling_params)
            if len(params_list) != len(prompts):
                raise ValueError(
                    f"got {len(params_list)} sampling_params for {len(prompts)} prompts"
                )
        tokenized = []
        for i, prompt in enumerate(prompts):
            try:
                tokenized.append(self.engine.tokenize(prompt))
            except ValueError as exc:
                raise ValueError(f"prompts[{i}]: {exc}") from exc
        ids = [f"gen-{next(self._ids)}" for _ in prompts]
        added: list[str] = []
        try:
            for request_id, (text, token_ids), params in zip(
                ids, tokenized, params_list, strict=True
            ):
                prompt_ids = {"prompt": text, "prompt_token_ids": token_ids}
                self.engine.add_request(request_id, prompt_ids, params)
                self.processor.add_request(request_id, text, token_ids, params)
                added.append(request_id)
        except ValueError:
            for request_id in added:
                self.engine.abort_request(request_id)
                self.processor.abort_request(request_id)
            raise
        finals: dict[str, RequestOutput] = {}
        with tqdm(total=len(ids), desc="generate", disable=not use_tqdm, unit="req") as bar:
            for output in self._run(set(ids)):
                finals[output.request_id] = output
                bar.update(1)
        return [finals[i] for i in ids]

    def _run(self, pending: set[str]) -> Iterator[RequestOutput]:
        while pending:
            processed = self.processor.process(self.engine.step().outputs)
            for request_id, indices in processed.stopped:
                self.engine.finish_sequences(request_id, indices, "abort")
            for output in processed.finished:
                if output.request_id in pending:
                    pending.discard(output.request_id)
                    yield output

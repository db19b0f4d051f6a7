"""The transformers baselines of the engine benchmark: static generate() and continuous batching.

Both get the workload's token ids and must produce exactly each request's output length (EOS
suppressed); only those requested tokens count.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from time import perf_counter
from typing import Any

import numpy as np
import torch
from tqdm.auto import tqdm

from benchmarks.common.workload import FIRST_REGULAR_TOKEN_ID
from benchmarks.offline.workloads import Workload


@dataclass
class HFRun:
    """One workload through a transformers path; `error` says why it did not run."""

    wall_s: float | None = None
    tok_s: float | None = None
    error: str | None = None
    details: dict[str, Any] = field(default_factory=dict)


def load_hf_model(model: str, dtype: torch.dtype = torch.float32) -> Any:
    """The checkpoint in transformers, in `dtype`, in eval mode."""
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(model, dtype=dtype)
    return hf.eval()


@torch.inference_mode()
def run_hf_static(
    hf: Any, workload: Workload, batch_size: int, pad_id: int, progress: bool = True
) -> HFRun:
    """generate() on arrival-order batches; each request counts only its own tokens."""
    label = f"hf-static {workload.name} (B={batch_size})"
    num_generated = 0  # including tokens past a request's own length (the batch's waste)
    total = workload.num_output_tokens
    with tqdm(total=total, desc=label, unit="tok", disable=not progress) as bar:
        start = perf_counter()
        for b in range(0, len(workload.prompts), batch_size):
            prompts = workload.prompts[b : b + batch_size]
            lens = workload.output_lens[b : b + batch_size]
            width, new_tokens = max(map(len, prompts)), max(lens)
            input_ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
            attention_mask = torch.zeros((len(prompts), width), dtype=torch.long)
            for row, prompt in enumerate(prompts):  # left padding
                input_ids[row, width - len(prompt) :] = torch.tensor(prompt)
                attention_mask[row, width - len(prompt) :] = 1
            out = hf.generate(
                input_ids=input_ids.to(hf.device),
                attention_mask=attention_mask.to(hf.device),
                max_new_tokens=new_tokens,
                min_new_tokens=new_tokens,  # suppresses EOS until the batch's longest is done
                do_sample=False,
                pad_token_id=pad_id,
            )
            assert out.shape[1] == width + new_tokens, f"batch generated {out.shape[1] - width}"
            num_generated += len(prompts) * new_tokens
            bar.update(sum(lens))
        wall_s = perf_counter() - start
    return HFRun(
        wall_s,
        workload.num_output_tokens / wall_s,
        details={"batch_size": batch_size, "num_tokens_generated_incl_padding": num_generated},
    )


def warm_up_hf_static(hf: Any, vocab_size: int, pad_id: int) -> None:
    """Two short generate() calls, untimed."""
    prompts = np.random.default_rng(54321).integers(FIRST_REGULAR_TOKEN_ID, vocab_size, (2, 40))
    warm = Workload("warmup", prompts.tolist(), [4, 4])
    run_hf_static(hf, warm, 2, pad_id, progress=False)


class _CBLogFilter(logging.Filter):
    """Keeps transformers' continuous-batching errors for the report; drops the psutil noise.

    Without psutil it cannot read CPU memory, which only matters when it sizes its own cache;
    here num_blocks and max_batch_tokens are given.
    """

    def __init__(self) -> None:
        super().__init__()
        self.errors: list[str] = []

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if "psutil" in message:
            return False
        if record.levelno >= logging.ERROR:
            self.errors.append(message.splitlines()[0][:300])
        return True


def run_hf_continuous(
    hf: Any,
    workload: Workload,
    num_kv_tokens: int,
    max_batch_tokens: int,
    max_num_seqs: int,
    timeout_s: float = 1800,
) -> HFRun:
    """transformers' continuous batching with per-request max_new_tokens and no EOS."""
    from transformers import ContinuousBatchingConfig, GenerationConfig

    label = f"hf-continuous {workload.name}"
    defaults = ContinuousBatchingConfig()
    # Tokens per KV page: `page_size` since transformers 5.2x, `block_size` before.
    page_size = getattr(defaults, "page_size", None) or defaults.block_size
    cb_config = ContinuousBatchingConfig(
        num_blocks=-(-num_kv_tokens // page_size),  # same KV capacity as Quire's pool
        max_batch_tokens=max_batch_tokens,
        max_requests_per_batch=max_num_seqs,
    )
    details = {
        "page_size": page_size,
        "num_blocks": cb_config.num_blocks,
        "max_batch_tokens": max_batch_tokens,
        "max_requests_per_batch": max_num_seqs,
        "attn_implementation": hf.config._attn_implementation,
        "api": "continuous_batching_context_manager + add_request(max_new_tokens=L, "
        "eos_token_id=-1): generate_batch accepts one max_new_tokens for every request",
    }
    generation_config = GenerationConfig(
        max_new_tokens=max(workload.output_lens), do_sample=False, eos_token_id=-1
    )
    log_filter = _CBLogFilter()
    cb_logger = logging.getLogger("ContinuousBatchingLogger")
    cb_logger.addFilter(log_filter)
    expected = {f"r{i}": n for i, n in enumerate(workload.output_lens)}
    try:
        with (
            hf.continuous_batching_context_manager(
                generation_config=generation_config,
                continuous_batching_config=cb_config,
                block=True,
                timeout=30,
            ) as manager,
            tqdm(total=workload.num_output_tokens, desc=label, unit="tok") as bar,
        ):
            start = perf_counter()
            for (request_id, n), prompt in zip(expected.items(), workload.prompts, strict=True):
                manager.add_request(
                    prompt, request_id=request_id, max_new_tokens=n, eos_token_id=-1
                )
            done: set[str] = set()
            while len(done) < len(expected):
                result = manager.get_result(timeout=1)
                if result is None:
                    if not manager.is_running() or perf_counter() - start > timeout_s:
                        raise RuntimeError(
                            f"generation stopped with {len(expected) - len(done)} requests left"
                        )
                    continue
                if not result.is_finished():
                    continue
                if result.error is not None:
                    raise RuntimeError(f"request {result.request_id} failed: {result.error}")
                got = len(result.generated_tokens)
                if got != expected[result.request_id]:
                    raise RuntimeError(
                        f"{result.request_id} produced {got} tokens, "
                        f"asked for {expected[result.request_id]}"
                    )
                done.add(result.request_id)
                bar.update(got)
            wall_s = perf_counter() - start
        return HFRun(wall_s, workload.num_output_tokens / wall_s, details=details)
    except Exception as exc:  # report the reason in the JSON instead of failing the benchmark
        reason = f"{type(exc).__name__}: {exc}"
        if log_filter.errors:
            reason += f" (transformers logged: {'; '.join(log_filter.errors[-3:])})"
        return HFRun(error=reason, details=details)
    finally:
        cb_logger.removeFilter(log_filter)

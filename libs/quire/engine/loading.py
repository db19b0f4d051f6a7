"""What an engine loads before its first step: weights, tokenizer, EOS ids, the KV pool size."""

from __future__ import annotations

import dataclasses
import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from quire.cache.paged_kv import kv_bytes_per_block
from quire.config import DEFAULT_CPU_KV_CACHE_BYTES, DEFAULT_GPU_MEMORY_UTILIZATION, EngineConfig
from quire.model import huge_pages
from quire.model.attention_layout import KVGroups
from quire.model.checkpoint import load_tokenizer, resolve_model_path
from quire.model.decoder import DecoderModel
from quire.model.loader import build_model, load_checkpoint
from quire.model.model_config import ModelConfig

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LoadedModel:
    """A checkpoint (directory or GGUF file) loaded for serving."""

    path: Path
    device: torch.device
    dtype: torch.dtype
    model: DecoderModel
    tokenizer: Any  # a transformers tokenizer
    max_model_len: int  # the config's limit, capped by the checkpoint's
    eos_token_ids: frozenset[int]

    @property
    def config(self) -> ModelConfig:
        return self.model.config


def load_engine_model(config: EngineConfig) -> LoadedModel:
    """Weights on the configured device and dtype, and the tokenizer; ValueError if unusable."""
    path = resolve_model_path(config.model)
    device = config.resolve_device()
    dtype = config.resolve_dtype(device)
    model_config, state = load_checkpoint(
        path, device, dtype, int8_activations=config.quantized_activations == "int8"
    )
    # The model is built for the context it serves: rotary tables that long, and LongRoPE's
    # factors chosen by it (quire.model.rope).
    if config.max_model_len is not None and config.max_model_len < model_config.max_model_len:
        model_config = dataclasses.replace(model_config, max_model_len=config.max_model_len)
    model = build_model(model_config, state, device)
    del state
    moved = huge_pages.move_into_huge_pages(model) if config.huge_pages else 0
    if moved:
        log.info("weights in huge pages: %.1f MiB", moved / 2**20)
    tokenizer = load_tokenizer(path)
    return LoadedModel(
        path=path,
        device=device,
        dtype=dtype,
        model=model,
        tokenizer=tokenizer,
        max_model_len=model_config.max_model_len,
        eos_token_ids=_eos_token_ids(path, model_config.eos_token_ids, tokenizer),
    )


def num_kv_blocks(config: EngineConfig, loaded: LoadedModel, groups: KVGroups | None = None) -> int:
    """Blocks in the KV pool: as configured, else what the memory budget holds (capped); a
    block holds `groups.num_slots` layers' KV (quire.model.attention_layout.KVGroups)."""
    if config.num_kv_blocks is not None:
        return config.num_kv_blocks
    num_groups = 1 if groups is None else groups.num_groups
    kv_dtype = config.resolve_kv_cache_dtype(loaded.dtype)
    per_block = kv_bytes_per_block(loaded.config, config.block_size, kv_dtype, groups)
    if loaded.device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(loaded.device)
        budget = int(free * DEFAULT_GPU_MEMORY_UTILIZATION)
    else:
        budget = DEFAULT_CPU_KV_CACHE_BYTES
    # No point holding more than every running sequence at full length could use.
    blocks_needed = num_groups * config.max_num_seqs * -(-loaded.max_model_len // config.block_size)
    return max(1, min(budget // per_block, blocks_needed))


def _eos_token_ids(path: Path, config_eos: tuple[int, ...], tokenizer: Any) -> frozenset[int]:
    """EOS ids from config.json, generation_config.json and the tokenizer, as generate() does."""
    eos = set(config_eos)
    generation = path / "generation_config.json"
    if generation.is_file():
        value = json.loads(generation.read_text()).get("eos_token_id")
        eos.update(value if isinstance(value, list) else [] if value is None else [value])
    if tokenizer.eos_token_id is not None:
        eos.add(int(tokenizer.eos_token_id))
    return frozenset(eos)

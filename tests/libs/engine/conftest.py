"""Checkpoints and a transformers oracle shared by the engine tests."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from quire_tools.make_model import make_checkpoint

from tests.checkpoints import tiny_checkpoint

REPO = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="session")
def tiny_model() -> Path:
    return tiny_checkpoint()


@pytest.fixture(scope="session")
def model_zoo(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """quire-tiny plus random configurations: MQA with llama3 rope; Qwen2 bias + tied; Qwen3
        (q/k norms, head_dim 48); Qwen3-MoE (4 experts, a dense layer); Mixtral (8 experts); Phi-3
        (fused qkv and gate_up; head_dim 64, and 128 with LongRoPE over 3/4 of each head); Mistral
        with a 24-token window on every layer; Gemma 2 (alternating 16-token windows, soft caps,
        head_dim 64, GQA 2); Gemma 3 (q/k norms, head_dim 128, MQA, a global layer among 24-token
        windows, two rope bases; and head_dim 64, GQA 2, 2 global layers among 5 sliding ones:
        KV groups of 2 with a slot idle); DeepSeek-V2 (MLA's latent cache, shared + routed experts: V2-Lite's
    shape with YaRN and a dense first layer, and one with q_lora_rank and top-1 of 4 experts);
    gpt-oss (attention sinks, biased attention, alternating 16-token windows, YaRN, 4 biased
    experts top-2 with a clamp the activations reach, head_dim 64, GQA 2; and head_dim 128, MQA,
    8 experts top-1, a 24-token window). Every window is shorter than most test prompts."""
    root = tmp_path_factory.mktemp("zoo")
    return {
        "tiny": tiny_model,
        "tiny-mqa": make_checkpoint(root / "mqa", "tiny-mqa", seed=1),
        "tiny-qwen2": make_checkpoint(root / "qwen2", "tiny-qwen2", seed=2),
        "tiny-qwen3": make_checkpoint(root / "qwen3", "tiny-qwen3", seed=3),
        "tiny-qwen3-moe": make_checkpoint(root / "qwen3-moe", "tiny-qwen3-moe", seed=4),
        "tiny-mixtral": make_checkpoint(root / "mixtral", "tiny-mixtral", seed=5),
        "tiny-phi3": make_checkpoint(root / "phi3", "tiny-phi3", seed=6),
        "tiny-phi3-longrope": make_checkpoint(root / "phi3-longrope", "tiny-phi3-longrope", seed=7),
        "tiny-mistral-window": make_checkpoint(
            root / "mistral-window", "tiny-mistral-window", seed=8
        ),
        "tiny-gemma2": make_checkpoint(root / "gemma2", "tiny-gemma2", seed=9),
        "tiny-gemma3": make_checkpoint(root / "gemma3", "tiny-gemma3", seed=10),
        "tiny-gemma3-uneven": make_checkpoint(
            root / "gemma3-uneven", "tiny-gemma3-uneven", seed=15
        ),
        "tiny-deepseek-v2": make_checkpoint(root / "deepseek-v2", "tiny-deepseek-v2", seed=11),
        "tiny-deepseek-v2-q-lora": make_checkpoint(
            root / "deepseek-v2-q-lora", "tiny-deepseek-v2-q-lora", seed=12
        ),
        "tiny-gpt-oss": make_checkpoint(root / "gpt-oss", "tiny-gpt-oss", seed=13),
        "tiny-gpt-oss-mqa": make_checkpoint(root / "gpt-oss-mqa", "tiny-gpt-oss-mqa", seed=14),
        # Other shapes of the same architectures (tests/libs/engine/test_hf_equivalence.py's
        # SHAPES): Qwen3 with head_dim 128 and MQA; Qwen3-MoE with 8 experts top-1, head_dim
        # 128, no dense layer; Mixtral with 4 experts top-1, head_dim 64 and a 24-token window.
        **{
            name: make_checkpoint(root / name, preset, seed=seed, overrides=overrides)
            for name, preset, seed, overrides in SHAPE_VARIANTS
        },
    }


SHAPE_VARIANTS: list[tuple[str, str, int, dict[str, object]]] = [
    ("tiny-qwen3-hd128", "tiny-qwen3", 16, {"head_dim": 128, "num_key_value_heads": 1}),
    (
        "tiny-qwen3-moe-8x1",
        "tiny-qwen3-moe",
        17,
        {"num_experts": 8, "num_experts_per_tok": 1, "head_dim": 128, "mlp_only_layers": []},
    ),
    (
        "tiny-mixtral-4x1",
        "tiny-mixtral",
        18,
        {"num_local_experts": 4, "num_experts_per_tok": 1, "head_dim": 64, "sliding_window": 24},
    ),
]


@dataclass
class Reference:
    token_ids: list[int]
    gaps: list[float]  # top-2 logit gap at each generated position


class HFOracle:
    """Greedy transformers generate(), one prompt at a time (no padding), memoized."""

    def __init__(self, path: Path) -> None:
        from transformers import AutoModelForCausalLM

        self.model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
        self.model.eval()
        self.cache: dict[tuple[tuple[int, ...], int], Reference] = {}

    def generate(self, prompt_ids: list[int], max_new_tokens: int) -> Reference:
        key = (tuple(prompt_ids), max_new_tokens)
        if key not in self.cache:
            with torch.inference_mode():
                out = self.model.generate(
                    torch.tensor([prompt_ids]),
                    attention_mask=torch.ones(1, len(prompt_ids), dtype=torch.long),
                    max_new_tokens=max_new_tokens,
                    do_sample=False,
                    output_logits=True,
                    return_dict_in_generate=True,
                    pad_token_id=0,
                )
            tokens = out.sequences[0, len(prompt_ids) :].tolist()
            gaps = []
            for logits in out.logits:
                top2 = logits[0].float().topk(2).values
                gaps.append(float(top2[0] - top2[1]))
            self.cache[key] = Reference(tokens, gaps)
        return self.cache[key]


@pytest.fixture(scope="session")
def oracles(model_zoo: dict[str, Path]) -> dict[str, HFOracle]:
    return {name: HFOracle(path) for name, path in model_zoo.items()}


def assert_matches_reference(got: list[int], ref: Reference, label: str) -> None:
    """Token-exact, except a divergence where the reference's top-2 gap is below 1e-3."""
    for j, (a, b) in enumerate(zip(got, ref.token_ids, strict=False)):
        if a != b:
            assert ref.gaps[j] < 1e-3, (
                f"{label}: token {j} differs ({a} vs reference {b}) "
                f"with a decisive top-2 gap {ref.gaps[j]:.2e}"
            )
            return
    assert len(got) == len(ref.token_ids), f"{label}: {len(got)} tokens vs {len(ref.token_ids)}"

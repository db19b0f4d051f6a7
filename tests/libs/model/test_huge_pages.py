"""Weights and KV blocks in transparent huge pages (quire.model.huge_pages): every tensor of a
loaded model moves into one arena advised MADV_HUGEPAGE, in place (the same tensor objects,
views still views of their base, tied tensors still tied), and the engine's outputs are the
same bits with and without it."""

from __future__ import annotations

import os
import random

import pytest
import torch

from quire import LLM, SamplingParams
from quire.model import huge_pages
from quire.model.resident import reachable_tensors
from tests.checkpoints import tiny_checkpoint

needs_thp = pytest.mark.skipif(
    not huge_pages.available(), reason="this kernel offers no transparent huge pages"
)


def advised_huge(tensor: torch.Tensor) -> bool:
    """Whether the mapping that holds `tensor`'s first byte carries madvise(MADV_HUGEPAGE)
    (`hg` among its VmFlags in /proc/self/smaps)."""
    address = tensor.data_ptr()
    inside = False
    with open(f"/proc/{os.getpid()}/smaps") as smaps:
        for line in smaps:
            head = line.split()[0]
            if "-" in head and not head.endswith(":"):
                lo, hi = (int(part, 16) for part in head.split("-"))
                inside = lo <= address < hi
            elif inside and head == "VmFlags:":
                return "hg" in line.split()[1:]
    return False


class Holder:
    """An object graph like a model's: attributes, lists, dicts, views, shared tensors."""

    def __init__(self) -> None:
        torch.manual_seed(0)
        self.weight = torch.randn(700, 900)  # 2.4 MiB
        self.view = self.weight[100:200, 3:]  # a strided view into it
        self.layers = [{"w": torch.randn(64, 576).to(torch.bfloat16)} for _ in range(40)]
        self.blocks = torch.randint(0, 255, (3_000_001,), dtype=torch.uint8)  # odd length
        self.ids = torch.arange(7)
        self.tied = self.layers[3]["w"]


@needs_thp
def test_every_tensor_moves_in_place_with_its_values_and_sharing() -> None:
    holder = Holder()
    tensors = list(reachable_tensors(holder))
    before = [(t, t.clone(), t.stride()) for t in tensors]
    storage_bytes = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors}
    moved = huge_pages.move_into_huge_pages(holder)
    storages = {t.untyped_storage().data_ptr() for t in reachable_tensors(holder)}
    assert len(storages) == 1, "one arena holds every tensor"
    assert (
        sum(storage_bytes.values()) <= moved < sum(storage_bytes.values()) + 64 * len(storage_bytes)
    )
    for obj, values, stride in before:
        assert torch.equal(obj, values)
        assert obj.stride() == stride
        assert obj.data_ptr() % 64 == 0 or obj is holder.view  # each storage starts on a line
    assert holder.tied is holder.layers[3]["w"]
    # the view still shares its base's memory, at the same offset from it
    assert holder.view.data_ptr() - holder.weight.data_ptr() == (100 * 900 + 3) * 4
    holder.weight[150, 10] = 12345.0
    assert holder.view[50, 7] == 12345.0
    assert advised_huge(holder.blocks)


@needs_thp
def test_zeros_is_zeroed_advised_memory() -> None:
    plane = huge_pages.zeros((512, 16, 3, 64), torch.bfloat16, torch.device("cpu"))
    assert plane.shape == (512, 16, 3, 64) and plane.dtype == torch.bfloat16
    assert plane.is_contiguous() and not plane.any()
    assert plane.data_ptr() % huge_pages.HUGE_PAGE_BYTES == 0
    assert advised_huge(plane)


def test_without_huge_pages_nothing_moves(monkeypatch: pytest.MonkeyPatch) -> None:
    huge_pages.available.cache_clear()
    monkeypatch.setattr(huge_pages, "_THP_ENABLED", huge_pages.Path("/nonexistent/enabled"))
    try:
        holder = Holder()
        pointer = holder.weight.data_ptr()
        assert huge_pages.move_into_huge_pages(holder) == 0
        assert holder.weight.data_ptr() == pointer
        plane = huge_pages.zeros((4, 16, 2, 8), torch.float32, torch.device("cpu"))
        assert plane.shape == (4, 16, 2, 8) and not plane.any()
    finally:
        huge_pages.available.cache_clear()


def run(huge: bool) -> tuple[LLM, list[tuple[list[int], list[float]]]]:
    llm = LLM(model=str(tiny_checkpoint()), dtype="float32", huge_pages=huge)
    rng = random.Random(3)
    vocab = llm.engine.model.config.vocab_size
    prompts = [[rng.randrange(3, vocab) for _ in range(n)] for n in (5, 16, 33)]
    params = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True, logprobs=0)
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    results = []
    for out in outs:
        choice = out.outputs[0]
        assert choice.logprobs is not None
        values = [
            step[t].logprob for t, step in zip(choice.token_ids, choice.logprobs, strict=True)
        ]
        results.append((list(choice.token_ids), values))
    return llm, results


@needs_thp
def test_the_engine_gives_the_same_bits_in_huge_pages() -> None:
    plain_llm, plain = run(huge=False)
    huge_llm, huge = run(huge=True)
    assert huge == plain
    model = huge_llm.engine.model
    weights = {t.untyped_storage().data_ptr() for t in reachable_tensors(model)}
    assert len(weights) == 1, "the model's tensors live in one arena"
    assert advised_huge(model.lm_head.weight)
    for planes in huge_llm.engine.runner.kv.slots:
        assert all(advised_huge(plane) for plane in planes)
    assert not advised_huge(plain_llm.engine.runner.kv.slots[0][0])

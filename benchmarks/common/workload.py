"""What the benchmarks and the load test send: random token ids and ShareGPT samples.

ShareGPT requests follow vLLM's rule (quire_tools.workloads.sharegpt), so one seed gives the same
requests to the offline and online benchmarks, the Locust users and vLLM's own client.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
from quire_tools.workloads import sharegpt

LENGTH_SIGMA = 0.9  # lognormal sigma of synthetic prompt and output lengths (ShareGPT-like)
FIRST_REGULAR_TOKEN_ID = 5  # random prompts draw ids from [5, vocab): 0-4 may be special


def random_token_ids(rng: np.random.Generator, vocab_size: int, n: int) -> list[int]:
    """n seeded random regular token ids (never a special one)."""
    ids: list[int] = rng.integers(FIRST_REGULAR_TOKEN_ID, vocab_size, n).tolist()
    return ids


def sample_sharegpt(
    data_path: str | Path, tokenizer: Any, n: int, seed: int
) -> list[sharegpt.SampleRequest]:
    """The first n ShareGPT requests of `seed` by vLLM's rule, tokenized with `tokenizer`."""
    conversations = sharegpt.read_conversations(data_path)
    return sharegpt.sample_requests(conversations, tokenizer, n, seed)

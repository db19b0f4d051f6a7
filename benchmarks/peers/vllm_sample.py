"""vLLM's own ShareGPT sampling, to check that Quire's sampler draws the same requests.

    .venv-vllm/bin/python benchmarks/peers/vllm_sample.py DATASET TOKENIZER_DIR N SEED OUT.json

Runs in the peer venv: builds `vllm bench serve`'s argument parser, samples N requests with its
`get_samples` (the code path of `--dataset-name sharegpt`), and writes
[[prompt, prompt_len, expected_output_len], ...] to OUT.json.
"""

from __future__ import annotations

import json
import sys


def main() -> None:
    from vllm.benchmarks.datasets import get_samples
    from vllm.benchmarks.serve import add_cli_args
    from vllm.tokenizers import get_tokenizer
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    path, tokenizer_dir, n, seed, out = sys.argv[1:6]
    parser = FlexibleArgumentParser()
    add_cli_args(parser)
    args = parser.parse_args(
        ["--dataset-name", "sharegpt", "--dataset-path", path, "--num-prompts", n]
        + ["--seed", seed, "--model", tokenizer_dir]
    )
    requests = get_samples(args, get_tokenizer(tokenizer_dir))
    with open(out, "w", encoding="utf-8") as f:
        json.dump([[r.prompt, r.prompt_len, r.expected_output_len] for r in requests], f)


if __name__ == "__main__":
    main()

"""What `logit_bias` costs the sampler: one step's `sample()` with no row biased, one row
biased and every row biased, on the default model's vocabulary.

    python -m benchmarks.logit_bias [--rows 1 32 256] [--vocab 49152] [--biased-tokens 16]

Greedy rows (the argmax path), float32 logits on the CPU; prints milliseconds per call (best
mean of 5 rounds) and the overhead against no bias. Rows without a bias take no part in the
scatter, so the "none" column is the sampler as it was before logit_bias existed.
"""

from __future__ import annotations

import argparse

import torch

from benchmarks.linear_layouts import best_of
from quire.engine.sampler import SampleRow, sample
from quire.sampling_params import SamplingParams


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 32, 256])
    parser.add_argument("--vocab", type=int, default=49152)  # SmolLM2's
    parser.add_argument("--biased-tokens", type=int, default=16)  # entries per biased row
    args = parser.parse_args()
    torch.manual_seed(0)
    bias = {
        t: (-100.0 if t % 2 else 5.0)
        for t in range(0, args.vocab, args.vocab // args.biased_tokens)
    }
    plain = SamplingParams(temperature=0)
    biased = SamplingParams(temperature=0, logit_bias=bias)
    print(f"{'rows':>6} {'none ms':>9} {'one ms':>9} {'all ms':>9} {'one/none':>9} {'all/none':>9}")
    for num_rows in args.rows:
        logits = torch.randn(num_rows, args.vocab)
        times = []
        for num_biased in (0, 1, num_rows):
            rows = [
                SampleRow(biased if i < num_biased else plain, [1, 2, 3], 3, None)
                for i in range(num_rows)
            ]
            times.append(
                1e3 * best_of(lambda rows=rows, logits=logits: sample(logits, rows), inner=20)
            )
        none, one, every = times
        print(
            f"{num_rows:>6} {none:>9.3f} {one:>9.3f} {every:>9.3f} "
            f"{one / none:>9.2f} {every / none:>9.2f}"
        )


if __name__ == "__main__":
    main()

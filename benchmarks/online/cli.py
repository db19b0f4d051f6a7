"""The online benchmark's command line."""

from __future__ import annotations

import argparse

import benchmarks.online
from benchmarks.online.config import CLIENTS, DEFAULTS, PEERS, QUICK, REPO, SYSTEM_DTYPES


def csv(value: object) -> list[str]:
    """ "a,b,,c" -> ["a", "b", "c"]."""
    return [x.strip() for x in str(value).split(",") if x.strip()]


def concurrency_points(value: object) -> list[int | None]:
    """ "1,4,all" -> [1, 4, None]: max requests in flight per point, None for all at once."""
    points: list[int | None] = []
    for x in csv(value):
        if x == "all":
            points.append(None)
        elif x.isdigit() and int(x) >= 1:
            points.append(int(x))
        else:
            raise ValueError(f"a concurrency is a positive integer or 'all', not {x!r}")
    if not points:
        raise ValueError("no concurrency point")
    return points


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The benchmark's options over DEFAULTS (and QUICK with --quick)."""
    p = argparse.ArgumentParser(
        description=benchmarks.online.__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    p.add_argument("--model", help=f"checkpoint dir (default {DEFAULTS['model']})")
    p.add_argument(
        "--gguf-stem",
        help="the GGUFs of the model are STEM.F32.gguf, STEM.Q4_1.gguf, ... (default: the "
        "default model's, from make peer-llamacpp); llama.cpp serves every row from them, "
        "Quire the q4_1 and q8_0 rows",
    )
    p.add_argument(
        "--dataset",
        choices=("sharegpt", "random"),
        help="ShareGPT requests (default) or random token ids of lognormal lengths",
    )
    p.add_argument("--data", help=f"ShareGPT JSON (default {DEFAULTS['data']}, from make data)")
    p.add_argument(
        "--peers",
        help=f"baselines to run, comma-separated, from {','.join(PEERS)} "
        f"(default {DEFAULTS['peers']}; the first is the main one)",
    )
    p.add_argument(
        "--dtypes",
        help=f"weight dtypes, each system in each it serves: float32, bfloat16, q4_1, q8_0 "
        f"(the GGUF files, Quire and llama.cpp) (default {DEFAULTS['dtypes']})",
    )
    p.add_argument(
        "--concurrency",
        help=f"the curve's points: max requests in flight, 'all' for every request at once "
        f"(default {DEFAULTS['concurrency']}; '' for no curve)",
    )
    p.add_argument(
        "--curve-prompts",
        help=f"requests per curve point, one for all or one per point "
        f"(default {DEFAULTS['curve_prompts']})",
    )
    p.add_argument(
        "--clients",
        help=f"who drives the curve: vllm (`vllm bench serve`), quire (this benchmark's "
        f"client) or both (default {DEFAULTS['clients']})",
    )
    p.add_argument(
        "--rates", help=f"Poisson request rates, req/s (default {DEFAULTS['rates'] or 'none'})"
    )
    p.add_argument("--num-prompts", type=int, help="requests per rate")
    p.add_argument("--input-len", type=float, help="mean prompt length (tokens)")
    p.add_argument("--output-len", type=float, help="mean output length (tokens)")
    p.add_argument("--max-input-len", type=int)
    p.add_argument("--max-output-len", type=int)
    p.add_argument(
        "--shared-prefix-len",
        type=int,
        help="tokens of a shared tenant prefix before each prompt (default 0: none)",
    )
    p.add_argument(
        "--num-shared-prefixes",
        type=int,
        help=f"distinct shared prefixes; request i gets prefix i %% K "
        f"(default {DEFAULTS['num_shared_prefixes']})",
    )
    p.add_argument("--slo-ttft-ms", type=float, default=DEFAULTS["slo_ttft_ms"])
    p.add_argument("--slo-tpot-ms", type=float, default=DEFAULTS["slo_tpot_ms"])
    p.add_argument("--warmup", type=int, help="warmup requests per system (not measured)")
    p.add_argument(
        "--num-executors",
        type=int,
        help=f"Quire executors (default {DEFAULTS['num_executors']}; --quick: 1)",
    )
    p.add_argument("--skip-baseline", action="store_true", help="no baselines (Quire only)")
    p.add_argument("--skip-quire", action="store_true")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=str(REPO / "bench" / "results"))
    p.add_argument(
        "--rescore",
        metavar="SERVING_JSON",
        help="judge a finished run again at --slo-ttft-ms / --slo-tpot-ms (no servers started)",
    )
    p.add_argument("--quick", action="store_true", help="smoke test (~30 s)")
    args = p.parse_args(argv)
    preset = {**DEFAULTS, **(QUICK if args.quick else {})}
    for key, value in preset.items():
        if getattr(args, key, None) is None:
            setattr(args, key, value)
    if args.shared_prefix_len < 0:
        p.error("--shared-prefix-len must be >= 0")
    if args.num_shared_prefixes < 1:
        p.error("--num-shared-prefixes must be >= 1")
    if args.shared_prefix_len > 0 and args.dataset == "sharegpt":
        p.error("--shared-prefix-len needs --dataset random")
    args.peers = [] if args.skip_baseline else csv(args.peers)
    unknown = set(args.peers) - set(PEERS)
    if unknown:
        p.error(f"--peers: unknown {sorted(unknown)}; choose from {', '.join(PEERS)}")
    args.dtypes = csv(args.dtypes)
    known_dtypes = {d for dtypes in SYSTEM_DTYPES.values() for d in dtypes}
    if not args.dtypes or set(args.dtypes) - known_dtypes:
        p.error(f"--dtypes: choose from {', '.join(sorted(known_dtypes))}")
    args.clients = csv(args.clients)
    if not args.clients or set(args.clients) - set(CLIENTS):
        p.error(f"--clients: choose from {', '.join(CLIENTS)}")
    try:
        args.concurrency = concurrency_points(args.concurrency) if csv(args.concurrency) else []
        args.rates = sorted(float(r) for r in csv(args.rates))
        prompts = [int(n) for n in csv(args.curve_prompts)]
    except ValueError as exc:
        p.error(str(exc))
    if len(prompts) == 1 or not args.concurrency:  # one count for every point (or no curve)
        prompts = prompts[:1] * len(args.concurrency)
    if len(prompts) != len(args.concurrency) or any(n < 1 for n in prompts):
        p.error("--curve-prompts: one positive count, or one per --concurrency point")
    args.curve_prompts = prompts
    if not args.concurrency and not args.rates:
        p.error("nothing to run: give --concurrency points or --rates")
    return args

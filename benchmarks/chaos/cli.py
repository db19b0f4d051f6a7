"""`make chaos`: every fault, the soak and overload, each on its own stack; chaos.json."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
from pathlib import Path
from typing import Any

import benchmarks.chaos
from benchmarks.chaos import migration
from benchmarks.chaos.faults import FAULTS
from benchmarks.chaos.pressure import overload, soak
from benchmarks.chaos.stack import QUICK, REPO, Plan, make_config, with_stack
from benchmarks.common.report import write_json

RESULTS = REPO / "bench" / "results" / "chaos.json"


def failures(results: dict[str, Any]) -> list[str]:
    """Every fault (and the soak) with hung, lost or leaked blocks; every migration fault
    with a client-visible error, a duplicated or missing token, or no migration at all."""
    bad = []
    for name, r in {**results.get("faults", {}), "soak": results.get("soak", {})}.items():
        for key in ("hung", "lost", "blocks_leaked"):
            if r.get(key, 0) != 0:
                bad.append(f"{name}: {key}={r[key]}")
        if "migrated" in r:  # a migration fault's figures
            bad += [f"{name}: {problem}" for problem in migration.failures(r)]
    return bad


async def run_all(plan: Plan, work_dir: Path, only: list[str] | None = None) -> dict[str, Any]:
    """Every fault, then the soak and overload, each on a fresh stack (`only` picks some)."""
    results: dict[str, Any] = {"faults": {}}
    for name, fault in FAULTS.items():
        if only and name not in only:
            continue
        print(f"fault {name} ...", flush=True)
        results["faults"][name] = await with_stack(
            make_config(),
            work_dir / name,
            lambda s, f=fault: f(s, plan),  # type: ignore[misc]
        )
        print(json.dumps(results["faults"][name]), flush=True)
    for seed, (name, inject) in enumerate(migration.MIGRATION_FAULTS.items()):
        if only and name not in only:
            continue
        print(f"fault {name} ...", flush=True)
        with migration.executor_env(**migration.migration_env(name)):
            results["faults"][name] = await with_stack(
                make_config(),
                work_dir / name,
                lambda s, i=inject, k=seed: migration.run_fault(s, plan, i, k),  # type: ignore[misc]
            )
        print(json.dumps(results["faults"][name]), flush=True)
    if not only or "soak" in only:
        print("soak ...", flush=True)
        results["soak"] = await with_stack(
            make_config(num_kv_blocks=24), work_dir / "soak", lambda s: soak(s, plan)
        )
    if not only or "overload" in only:
        print("overload ...", flush=True)
        config = make_config(num_kv_blocks=512, max_pending_per_executor=4, max_pending_total=8)
        results["overload"] = await with_stack(
            config, work_dir / "overload", lambda s: overload(s, plan)
        )
    return results


def main(argv: list[str] | None = None) -> int:
    """Run `make chaos`, write chaos.json; exit status 1 on any hung, lost or leaked block."""
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.chaos", description=benchmarks.chaos.__doc__
    )
    parser.add_argument("--quick", action="store_true", help="small counts (a smoke run)")
    parser.add_argument("--only", nargs="*", help="fault names, soak, overload")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--work-dir", type=Path, default=REPO / ".run" / "chaos")
    args = parser.parse_args(argv)
    plan = QUICK if args.quick else Plan()
    # Executors pull whatever the tiny model's costs say, so the faults meet pulls in flight.
    os.environ.setdefault("QUIRE_PULL_POLICY", "always")
    results = asyncio.run(run_all(plan, args.work_dir, args.only))
    write_json(args.out, results)
    bad = failures(results)
    print(f"wrote {args.out}" + (f"; FAILED: {', '.join(bad)}" if bad else "; all faults clean"))
    return 1 if bad else 0

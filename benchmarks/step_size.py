"""Bytes and milliseconds of one memory-manager Step, block-table deltas against full tables.

    python -m benchmarks.step_size [--seqs 16,64,256] [--steps 200] [--block-size 16]

For each number of running sequences it starts a real memory manager (the gRPC servicer,
`MemoryManagerServer`) on a local socket in a child process, admits that many sequences
with context lengths drawn uniformly from [--min-context, --max-context] tokens, and then
runs --steps decode steps: every sequence appends one token and commits what was computed,
as the executor's scheduler does. The same steps run twice, on two fresh managers:

- `full`: the pre-delta protocol, emulated by the managers of this benchmark
  (`WholeTablesManager`: every sequence the step names gets its whole table as a new-table
  update, the same bytes as the whole tables the protocol sent before), and a commit for
  every sequence on every step, as the scheduler sent them before;
- `delta`: table updates only (a sequence whose table did not change is not mentioned), and
  commits only when a sequence's computed tokens fill a new block (the scheduler now).

Per step it records the request and response sizes (serialized protobuf) and the client's
wall time of the round trip (encode, the RPC, decode, applying the tables to the executor's
copy). The same steps then run once more in one process without sockets, timing the CPU
work of each side: the client's encode, the server's decode + `BlockManager.step` + encode,
the client's decode + apply (on a busy machine the round trip includes waiting for a core;
this split does not). It prints a table, writes bench/results/step_size.json and draws
bench/results/step_size.png.
"""

from __future__ import annotations

import argparse
import multiprocessing
import random
import statistics
import time
from pathlib import Path
from typing import Any

import grpc

from benchmarks.common.report import pyplot, write_json
from quire.block import (
    AdmitRequest,
    AppendRequest,
    BlockManager,
    BlockTables,
    CommitRequest,
    StepAllocation,
    StepAllocationResult,
    TableUpdate,
)
from quire.block.tables import named_seq_ids
from services.common.wire.memory_manager import (
    result_from_proto,
    result_to_proto,
    step_from_proto,
    step_to_proto,
)
from services.memory_manager.manager_servicer import check_step
from services.rpc import memory_manager_pb2 as pb
from services.rpc import memory_manager_pb2_grpc as pb_grpc

MODES = ("full", "delta")
EXECUTOR_ID = "bench-executor"


class WholeTablesManager(BlockManager):
    """A BlockManager answering in the pre-delta form: the whole table of every sequence
    the step names (a new-table update each), whether it changed or not."""

    def step(self, request: StepAllocation) -> StepAllocationResult:
        result = super().step(request)
        result.table_updates = {
            seq_id: TableUpdate(0, tuple(self.block_table(seq_id)))
            for seq_id in named_seq_ids(request, result)
        }
        return result


def serve(port_queue: Any, full: bool = False) -> None:
    """Child process: a memory manager (no Redis) on a free local port, until killed;
    `full`: its pools are `WholeTablesManager`s."""
    import asyncio

    from services.memory_manager import pools
    from services.memory_manager.manager_server import MemoryManagerServer
    from services.memory_manager.manager_settings import Settings

    if full:
        pools.BlockManager = WholeTablesManager  # type: ignore[misc]

    async def main() -> None:
        server = MemoryManagerServer(Settings(port=0, redis_url=""))
        port_queue.put(await server.start())
        await server.wait()

    asyncio.run(main())


class Workload:
    """N running sequences and the decode steps they take (the same for both modes)."""

    def __init__(self, num_seqs: int, args: argparse.Namespace) -> None:
        rng = random.Random(args.seed + num_seqs)
        self.block_size = args.block_size
        self.prompts = [
            tuple(
                rng.randrange(32000) for _ in range(rng.randint(args.min_context, args.max_context))
            )
            for _ in range(num_seqs)
        ]
        self.seq_ids = [f"req-{i:08x}-{rng.getrandbits(64):016x}-0" for i in range(num_seqs)]
        self.num_tokens = {s: len(p) for s, p in zip(self.seq_ids, self.prompts, strict=True)}
        max_tokens = args.max_context + args.steps + 1
        # Room for every sequence at its longest, plus a margin: decode never preempts.
        self.num_blocks = num_seqs * (-(max_tokens // -args.block_size)) + 64
        self.rng = rng

    def admits(self, chunk: int) -> list[StepAllocation]:
        """The prompts admitted `chunk` at a time (the executor's prefill)."""
        pairs = list(zip(self.seq_ids, self.prompts, strict=True))
        return [
            StepAllocation(admits=tuple(AdmitRequest(s, p) for s, p in pairs[i : i + chunk]))
            for i in range(0, len(pairs), chunk)
        ]

    def decode_step(self, commit_every_step: bool) -> StepAllocation:
        """One token for every sequence; commits of everything computed before it (every
        step, or only where that fills a new block)."""
        commits = tuple(
            CommitRequest(s, self.num_tokens[s])
            for s in self.seq_ids
            if commit_every_step or self.num_tokens[s] % self.block_size == 0
        )
        appends = tuple(AppendRequest(s, (self.rng.randrange(32000),)) for s in self.seq_ids)
        for seq_id in self.seq_ids:
            self.num_tokens[seq_id] += 1
        return StepAllocation(commits=commits, appends=appends)


class Client:
    """What the executor's RemoteBlockAllocator does per step, with the sizes recorded."""

    def __init__(self, target: str, workload: Workload) -> None:
        self.channel = grpc.insecure_channel(target)
        self.stub = pb_grpc.MemoryManagerStub(self.channel)
        self.tables = BlockTables(workload.block_size)
        self.stub.Register(
            pb.RegisterRequest(
                executor_id=EXECUTOR_ID,
                epoch=1,
                num_blocks=workload.num_blocks,
                block_size=workload.block_size,
                enable_prefix_caching=True,
            )
        )

    def step(self, request: StepAllocation) -> tuple[int, int, float]:
        """(request bytes, response bytes, seconds) of one Step round trip."""
        start = time.perf_counter()
        message = step_to_proto(EXECUTOR_ID, 1, request)
        response = self.stub.Step(message)
        result = result_from_proto(response)
        self.tables.apply(request, result)
        elapsed = time.perf_counter() - start
        return message.ByteSize(), response.ByteSize(), elapsed

    def close(self) -> None:
        self.channel.close()


class InProcess:
    """Both ends of a Step in one process, without sockets: each side's CPU time."""

    PARTS = ("client_encode", "server", "allocator_step", "client_decode_apply")

    def __init__(self, workload: Workload, full: bool) -> None:
        manager = WholeTablesManager if full else BlockManager
        self.manager = manager(workload.num_blocks, workload.block_size)
        self.tables = BlockTables(workload.block_size)

    def step(self, request: StepAllocation) -> tuple[float, float, float, float]:
        """Seconds of: client encode, server total, of which BlockManager.step, client decode."""
        t0 = time.perf_counter()
        data = step_to_proto(EXECUTOR_ID, 1, request).SerializeToString()
        t1 = time.perf_counter()
        message = pb.StepRequest.FromString(data)
        check_step(message)
        allocation = step_from_proto(message)
        t2 = time.perf_counter()
        result = self.manager.step(allocation)
        t3 = time.perf_counter()
        reply = result_to_proto(result).SerializeToString()
        t4 = time.perf_counter()
        self.tables.apply(request, result_from_proto(pb.StepResponse.FromString(reply)))
        t5 = time.perf_counter()
        return t1 - t0, t4 - t1, t3 - t2, t5 - t4


def measure(num_seqs: int, mode: str, args: argparse.Namespace) -> dict[str, Any]:
    """Per-step figures of `args.steps` decode steps with `num_seqs` running, in `mode`."""
    workload = Workload(num_seqs, args)
    full = mode == "full"
    ports: Any = multiprocessing.get_context("spawn").Queue()
    server = multiprocessing.get_context("spawn").Process(
        target=serve, args=(ports, full), daemon=True
    )
    server.start()
    try:
        client = Client(f"127.0.0.1:{ports.get(timeout=60)}", workload)
        split = InProcess(workload, full)
        for admit in workload.admits(chunk=16):
            client.step(admit)
            split.step(admit)
        sizes_in: list[int] = []
        sizes_out: list[int] = []
        rpc_s: list[float] = []
        split_s: list[tuple[float, float, float, float]] = []
        for _ in range(args.warmup + args.steps):
            request = workload.decode_step(commit_every_step=full)
            num_in, num_out, elapsed = client.step(request)
            parts = split.step(request)
            sizes_in.append(num_in)
            sizes_out.append(num_out)
            rpc_s.append(elapsed)
            split_s.append(parts)
        # Both copies hold the server's tables (checked outside the timed loop).
        for seq_id in workload.seq_ids:
            assert client.tables.get(seq_id) == split.manager.block_table(seq_id), seq_id
        client.close()
    finally:
        server.kill()
        server.join(timeout=10)
    sizes_in, sizes_out = sizes_in[args.warmup :], sizes_out[args.warmup :]
    rpc_s, split_s = rpc_s[args.warmup :], split_s[args.warmup :]
    mean_blocks = statistics.mean(len(split.manager.block_table(s)) for s in workload.seq_ids)
    cpu_ms = {
        part: 1000 * statistics.mean(parts[i] for parts in split_s)
        for i, part in enumerate(InProcess.PARTS)
    }
    return {
        "num_seqs": num_seqs,
        "mode": mode,
        "mean_blocks_per_seq": mean_blocks,
        "request_bytes_mean": statistics.mean(sizes_in),
        "response_bytes_mean": statistics.mean(sizes_out),
        "response_bytes_max": max(sizes_out),
        "rpc_ms_mean": 1000 * statistics.mean(rpc_s),
        "rpc_ms_p50": 1000 * statistics.median(rpc_s),
        "rpc_ms_p99": 1000 * sorted(rpc_s)[int(0.99 * (len(rpc_s) - 1))],
        "cpu_ms": cpu_ms,
        "cpu_ms_total": sum(cpu_ms[p] for p in InProcess.PARTS if p != "allocator_step"),
    }


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    plt = pyplot()
    fig, (ax_bytes, ax_ms) = plt.subplots(1, 2, figsize=(10, 4))
    for mode in MODES:
        mine = [r for r in rows if r["mode"] == mode]
        seqs = [r["num_seqs"] for r in mine]
        ax_bytes.plot(seqs, [r["response_bytes_mean"] / 1024 for r in mine], "o-", label=mode)
        ax_ms.plot(seqs, [r["rpc_ms_mean"] for r in mine], "o-", label=mode)
    for ax, label in ((ax_bytes, "Step response, KiB (mean)"), (ax_ms, "Step round trip, ms")):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("running sequences (decode)")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
        ax.legend()
    fig.suptitle("memory-manager Step: full block tables vs table deltas")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seqs", default="16,64,256", help="running sequences, comma-separated")
    parser.add_argument("--steps", type=int, default=200, help="timed decode steps per run")
    parser.add_argument("--warmup", type=int, default=20, help="untimed decode steps first")
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--min-context", type=int, default=500)
    parser.add_argument("--max-context", type=int, default=1500)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=Path("bench/results/step_size.json"))
    args = parser.parse_args(argv)

    rows = []
    for num_seqs in (int(n) for n in args.seqs.split(",")):
        for mode in MODES:
            rows.append(measure(num_seqs, mode, args))
            print_row(rows[-1])
    results = {"config": {k: v for k, v in vars(args).items() if k != "out"}, "runs": rows}
    write_json(args.out, results)
    plot(rows, args.out.with_suffix(".png"))
    print(f"wrote {args.out} and {args.out.with_suffix('.png')}")
    return results


def print_row(row: dict[str, Any]) -> None:
    print(
        f"{row['num_seqs']:4d} seqs {row['mode']:>5}: request {row['request_bytes_mean']:8.0f} B, "
        f"response {row['response_bytes_mean']:8.0f} B (max {row['response_bytes_max']}), "
        f"round trip {row['rpc_ms_mean']:6.2f} ms (p50 {row['rpc_ms_p50']:.2f}, "
        f"p99 {row['rpc_ms_p99']:.2f}); CPU {row['cpu_ms_total']:.2f} ms "
        f"({', '.join(f'{k} {v:.2f}' for k, v in row['cpu_ms'].items())})"
    )


if __name__ == "__main__":
    main()

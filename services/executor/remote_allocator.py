"""RemoteBlockAllocator: the `BlockAllocator` protocol served by a memory manager over gRPC.

The executor's engine loop is synchronous and calls `step()` once per engine step,
so this client uses a synchronous gRPC channel: one Step RPC per call, the same
`StepAllocation` in and `StepAllocationResult` out as the in-process `BlockManager`.
Calls are serialized by a lock, so a heartbeat thread may call `stats()` safely.

Errors: INVALID_ARGUMENT (a malformed step; the manager changed nothing) raises
ValueError, like `BlockManager`; FAILED_PRECONDITION (our epoch is stale: another
incarnation of this executor registered since) raises `StaleEpochError`; the
manager staying unreachable raises `AllocatorUnavailableError`.

Restart handling. The executor is the source of truth for its live sequences.
When Step fails with NOT_FOUND (the manager restarted and forgot us) or
UNAVAILABLE / DEADLINE_EXCEEDED (it is down, or the answer was lost, so the step
may or may not have been applied), the client:

1. re-registers with the executor's `BlockTables.live_sequences()`, its truth BEFORE
   this step's changes (token ids and block tables as the allocator last granted
   them, and the tokens committed so far). The manager rebuilds its state from
   exactly that, which makes the retry idempotent whether or not the failed step
   was applied;
2. retries the same step, filtered against the live set: commits and frees of
   sequences the new manager does not know are dropped (their blocks are simply
   free now); forks of an unknown parent and appends to an unknown sequence are
   a bug in the caller and raise ValueError; admits are kept as they are.

Block tables arrive as deltas (quire.block.tables). This client reads the executor's
one `BlockTables` (the model runner's, which applies each result) but never applies to
it. Every `verify_every`-th step (0: never) asks for checksums of the full tables the
step names, which the tables compare. A failed check (`TableDriftError`: an update was
lost or misapplied) is repaired like a restart through `resync()`: the executor's tables
say where its KV actually is, so the client re-registers with them, and the manager
rebuilds its state from them, then the step is retried with verification on.

Quiet steps (quire.block.allocator). With `defer_quiet_steps`, a step whose appends all fit
in their sequences' own partial last blocks and whose commits complete no new full block,
with nothing else in it, makes no call: its result (nothing changes) is returned at once and
its tokens and commits are held back. The next step that needs the manager carries them
(`deferred_appends`, and the latest commit of each sequence). A sequence forked since it last
appended in a sent step may share its last block, so its appends are never quiet; nor is any
step of a model whose layers slide a window (its commits release blocks). Re-registering
sends the tables, which already hold every held-back token, so it drops what was held back.
At block size 16 a lone decoding sequence calls the manager once every 16 steps.

Unreachable managers are retried with exponential backoff (re-registering before
every retry) for at most `retry_total_s` seconds, then `AllocatorUnavailableError`
is raised. `register()` retries the same way, so an executor may start first.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from types import TracebackType

import grpc
import structlog

from quire.block.allocator import (
    AllocatorStats,
    AppendRequest,
    CommitRequest,
    StepAllocation,
    StepAllocationResult,
)
from quire.block.restore import LiveSequenceState
from quire.block.tables import BlockTables
from quire.block.window import TableLayout
from services.common import tls
from services.common.epochs import StaleEpochError
from services.common.wire.memory_manager import (
    live_to_proto,
    result_from_proto,
    stats_from_proto,
    step_to_proto,
)
from services.rpc import memory_manager_pb2 as pb
from services.rpc import memory_manager_pb2_grpc as pb_grpc

log = structlog.get_logger(__name__)

# The manager is down or did not answer in time (a Step may or may not have applied).
_UNREACHABLE = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)
# Codes after which the manager may have lost us or our step: re-register, retry.
_RECOVERABLE = (grpc.StatusCode.NOT_FOUND, *_UNREACHABLE)
# Reconnect quickly once a restarted manager listens again (gRPC's default waits up to 120 s).
_CHANNEL_OPTIONS = [
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
]


class RemoteAllocatorError(RuntimeError):
    """The memory manager refused or failed a call."""


class AllocatorUnavailableError(RemoteAllocatorError):
    """The memory manager could not be reached (for longer than the retry budget)."""


def filter_step(request: StepAllocation, live_ids: set[str]) -> StepAllocation:
    """`request` without the commits and frees of sequences outside `live_ids`.

    Used after re-registering with a manager that knows only `live_ids`. Children
    forked in this step count as known from their fork on. Raises ValueError for
    a fork whose parent or an append whose sequence is unknown (a caller bug).
    """
    known = set(live_ids)
    for fork in request.forks:
        if fork.parent_seq_id not in known:
            raise ValueError(
                f"forks: parent_seq_id {fork.parent_seq_id!r} is not a live sequence "
                "of this executor (live_sequences() and the step disagree)"
            )
        known.add(fork.child_seq_id)
    for append in request.appends:
        if append.seq_id not in known:
            raise ValueError(
                f"appends: seq_id {append.seq_id!r} is not a live sequence "
                "of this executor (live_sequences() and the step disagree)"
            )
    return StepAllocation(
        forks=request.forks,
        commits=tuple(c for c in request.commits if c.seq_id in known),
        frees=tuple(seq_id for seq_id in request.frees if seq_id in known),
        appends=request.appends,
        admits=request.admits,
    )


class RemoteBlockAllocator:
    """A `BlockAllocator` whose state lives in a memory manager (one Step RPC per step)."""

    def __init__(
        self,
        target: str,
        executor_id: str,
        epoch: int,
        num_blocks: int,
        block_size: int,
        enable_prefix_caching: bool,
        address: str,
        tables: BlockTables,
        timeout_s: float = 5.0,
        retry_total_s: float = 30.0,
        min_backoff_s: float = 0.05,
        max_backoff_s: float = 1.0,
        step_metadata: Callable[[StepAllocation], Sequence[tuple[str, str]]] | None = None,
        tls_ca: str = "",
        verify_every: int = 0,
        accepts_pulls: bool = False,
        sliding_window: int | None = None,
        layout: TableLayout | None = None,
        defer_quiet_steps: bool = True,
    ) -> None:
        """`step_metadata(step)` is sent as gRPC metadata with that step's Step call (the
        executor sends the request ids the step touches, for the manager's logs).
        `tls_ca` (a PEM CA bundle path) dials the manager over TLS; '' is plaintext.
        `verify_every`: check the tables' checksums every that many steps (0: never).
        `accepts_pulls`: ask the manager to offer peers' blocks (PullOffer) in steps.
        `sliding_window`: every layer's window, when the manager is to release blocks
        outside it (quire.block.window); None keeps every block. `layout`: the KV groups of
        a hybrid model's tables instead (quire.block.window.TableLayout).
        `defer_quiet_steps`: make no call for a step that needs nothing from the manager
        (module docstring); never for a model with a window."""
        if layout is not None and sliding_window is not None:
            raise ValueError("pass sliding_window or layout, not both")
        layout = layout if layout is not None else TableLayout.of(sliding_window)
        if verify_every < 0:
            raise ValueError(f"verify_every: must be >= 0, got {verify_every}")
        self.target = target
        self.executor_id = executor_id
        self.epoch = epoch
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.address = address
        self.tables = tables  # the executor's, read when re-registering
        self.timeout_s = timeout_s
        self.retry_total_s = retry_total_s
        self.min_backoff_s = min_backoff_s
        self.max_backoff_s = max_backoff_s
        self.step_metadata = step_metadata
        self.manager_id: str | None = None  # from the last successful Register
        # The manager process registered with: pins it grants name it (PullOffer.granted_by).
        self.manager_instance: str | None = None
        self.layout = layout
        self.num_groups = layout.num_groups
        self.accepts_pulls = accepts_pulls
        self.sliding_window = layout.sliding_window
        self.num_registrations = 0
        self.verify_every = verify_every
        self.num_steps = 0
        self.num_resyncs = 0  # table drift repaired by re-registering
        self.defer_quiet_steps = (
            defer_quiet_steps and layout.num_groups == 1 and layout.sliding_window is None
        )
        self.num_quiet_steps = 0  # steps that made no call
        # What quiet steps held back: seq id -> its tokens, and -> its latest commit.
        self._deferred_tokens: dict[str, list[int]] = {}
        self._deferred_commits: dict[str, int] = {}
        # Sequences that may share their last block (forked since they last appended in a
        # sent step): their appends are never quiet.
        self._shared_tails: set[str] = set()
        # Set while a step waits for the manager to come back (re-registering and retrying);
        # read by other threads: the executor's liveness record says so, and routers do not
        # take that executor's silence for a hang.
        self.is_recovering = False
        self._lock = threading.Lock()
        self._channel = tls.channel(target, tls_ca, _CHANNEL_OPTIONS)
        self._stub = pb_grpc.MemoryManagerStub(self._channel)

    # ------------------------------------------------------------ the protocol

    def step(self, request: StepAllocation) -> StepAllocationResult:
        """Apply one engine step on the manager; re-register and retry if it lost us."""
        with self._lock:
            if self.defer_quiet_steps and self._is_quiet(request):
                self._hold_back(request)
                self.num_quiet_steps += 1
                return StepAllocationResult()
            self.num_steps += 1
            if self.verify_every and self.num_steps % self.verify_every == 0:
                request = replace(request, verify_tables=True)
            message = step_to_proto(self.executor_id, self.epoch, self._with_held_back(request))
            metadata = self.step_metadata(request) if self.step_metadata else None
            try:
                response = self._stub.Step(message, timeout=self.timeout_s, metadata=metadata)
            except grpc.RpcError as exc:
                if exc.code() not in _RECOVERABLE:
                    raise _translate(exc, "Step") from exc
                log.warning(
                    "memory manager lost this executor; re-registering",
                    executor_id=self.executor_id,
                    code=exc.code().name,
                )
                response = self._recover_and_step(request, exc, metadata)
            self._drop_held_back()
            result = result_from_proto(response)
            self._note_sent(request, result)
            return result

    def _is_quiet(self, request: StepAllocation) -> bool:
        """Whether `request` needs nothing from the manager (module docstring)."""
        if (
            request.forks
            or request.frees
            or request.admits
            or request.released_pins
            or request.verify_tables
            or request.deferred_appends
        ):
            return False
        tables, block_size = self.tables, self.block_size
        for append in request.appends:
            if append.seq_id in self._shared_tails or append.seq_id not in tables:
                return False
            if len(append.token_ids) > tables.free_slots(append.seq_id):
                return False
        for commit in request.commits:
            if commit.seq_id not in tables:
                return False
            held = tables.num_committed_tokens(commit.seq_id)
            if commit.num_computed_tokens // block_size > held // block_size:
                return False
        return True

    def _hold_back(self, request: StepAllocation) -> None:
        for append in request.appends:
            self._deferred_tokens.setdefault(append.seq_id, []).extend(append.token_ids)
        for commit in request.commits:
            held = self._deferred_commits.get(commit.seq_id, 0)
            self._deferred_commits[commit.seq_id] = max(held, commit.num_computed_tokens)

    def _with_held_back(self, request: StepAllocation) -> StepAllocation:
        """`request` carrying what quiet steps held back."""
        if not self._deferred_tokens and not self._deferred_commits:
            return request
        committed = {c.seq_id for c in request.commits}
        return replace(
            request,
            deferred_appends=tuple(
                AppendRequest(seq_id, tuple(token_ids))
                for seq_id, token_ids in self._deferred_tokens.items()
            ),
            commits=request.commits
            + tuple(
                CommitRequest(seq_id, count)
                for seq_id, count in self._deferred_commits.items()
                if seq_id not in committed
            ),
        )

    def _drop_held_back(self) -> None:
        self._deferred_tokens.clear()
        self._deferred_commits.clear()

    def _note_sent(self, request: StepAllocation, result: StepAllocationResult) -> None:
        """Track which sequences may share their last block after a sent step."""
        shared = self._shared_tails
        for fork in request.forks:
            shared.add(fork.parent_seq_id)
            shared.add(fork.child_seq_id)
        for append in request.appends:
            if append.token_ids and append.seq_id not in result.preempted:
                shared.discard(append.seq_id)
        for seq_id in (*request.frees, *result.preempted):
            shared.discard(seq_id)

    def resync(self, request: StepAllocation, reason: str) -> StepAllocationResult:
        """Rebuild the manager from the executor's tables (re-register), redo the step."""
        with self._lock:
            self.num_resyncs += 1
            log.warning(
                "block tables drifted from the memory manager's; re-registering",
                executor_id=self.executor_id,
                error=reason,
            )
            metadata = self.step_metadata(request) if self.step_metadata else None
            result = result_from_proto(self._recover_and_step(request, None, metadata))
            self._note_sent(request, result)
            return result

    def stats(self) -> AllocatorStats:
        """The executor's pool counters on the manager (one attempt, no re-registration)."""
        with self._lock:
            try:
                message = self._stub.GetStats(
                    pb.GetStatsRequest(executor_id=self.executor_id), timeout=self.timeout_s
                )
            except grpc.RpcError as exc:
                raise _translate(exc, "GetStats") from exc
            return stats_from_proto(message)

    # ------------------------------------------------------------- lifecycle

    def register(self) -> str:
        """Announce this executor with its live sequences; returns the manager's id.

        Retries while the manager is unreachable (up to `retry_total_s`).
        """
        with self._lock:
            deadline = time.monotonic() + self.retry_total_s
            backoff = self.min_backoff_s
            while True:
                try:
                    self._register_once()
                    assert self.manager_id is not None
                    return self.manager_id
                except grpc.RpcError as exc:
                    if exc.code() not in _UNREACHABLE or time.monotonic() >= deadline:
                        raise _translate(exc, "Register") from exc
                backoff = self._sleep(backoff, deadline)

    def deregister(self) -> None:
        """Tell the manager this incarnation is leaving (its blocks and prefix key go)."""
        with self._lock:
            request = pb.DeregisterRequest(executor_id=self.executor_id, epoch=self.epoch)
            try:
                self._stub.Deregister(request, timeout=self.timeout_s)
            except grpc.RpcError as exc:
                if exc.code() != grpc.StatusCode.NOT_FOUND:
                    raise _translate(exc, "Deregister") from exc

    def close(self) -> None:
        """Close the channel (does not deregister)."""
        self._channel.close()

    def __enter__(self) -> RemoteBlockAllocator:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    # --------------------------------------------------------------- helpers

    def _register_once(self) -> list[LiveSequenceState]:
        live = self.tables.live_sequences()
        request = pb.RegisterRequest(
            executor_id=self.executor_id,
            epoch=self.epoch,
            num_blocks=self.num_blocks,
            block_size=self.block_size,
            enable_prefix_caching=self.enable_prefix_caching,
            address=self.address,
            live_sequences=[live_to_proto(state) for state in live],
            accepts_pulls=self.accepts_pulls,
            sliding_window=self.sliding_window if self.num_groups == 1 else None,
            group_windows=[w or 0 for w in self.layout.windows] if self.num_groups > 1 else [],
        )
        response = self._stub.Register(request, timeout=self.timeout_s)
        # The manager now holds exactly the executor's tables (every held-back token among
        # them); updates apply on top of them.
        self._drop_held_back()
        self.manager_id = response.manager_id
        self.manager_instance = response.instance_id
        self.num_registrations += 1
        log.info(
            "registered with memory manager",
            executor_id=self.executor_id,
            epoch=self.epoch,
            manager_id=self.manager_id,
            num_live_sequences=len(live),
        )
        return live

    def _recover_and_step(
        self,
        request: StepAllocation,
        error: grpc.RpcError | None,
        metadata: Sequence[tuple[str, str]] | None = None,
    ) -> pb.StepResponse:
        self.is_recovering = True
        try:
            return self._retry_step(request, error, metadata)
        finally:
            self.is_recovering = False

    def _retry_step(
        self,
        request: StepAllocation,
        error: grpc.RpcError | None,
        metadata: Sequence[tuple[str, str]] | None,
    ) -> pb.StepResponse:
        deadline = time.monotonic() + self.retry_total_s
        backoff = self.min_backoff_s
        # A manager that answered NOT_FOUND (or a resync: it answered) is up: re-register at once.
        if error is not None and error.code() != grpc.StatusCode.NOT_FOUND:
            backoff = self._sleep(backoff, deadline)
        while True:
            try:
                live = self._register_once()
                filtered = filter_step(request, {state.seq_id for state in live})
                message = step_to_proto(self.executor_id, self.epoch, filtered)
                response: pb.StepResponse = self._stub.Step(
                    message, timeout=self.timeout_s, metadata=metadata
                )
                return response
            except grpc.RpcError as exc:
                if exc.code() not in _RECOVERABLE:
                    raise _translate(exc, "Step") from exc
                if time.monotonic() >= deadline:
                    raise AllocatorUnavailableError(
                        f"memory manager at {self.target} unreachable for "
                        f"{self.retry_total_s:.0f} s: {exc.code().name} {exc.details()}"
                    ) from exc
            backoff = self._sleep(backoff, deadline)

    def _sleep(self, backoff: float, deadline: float) -> float:
        time.sleep(max(0.0, min(backoff, deadline - time.monotonic())))
        return min(backoff * 2, self.max_backoff_s)


def _translate(exc: grpc.RpcError, call: str) -> Exception:
    code, details = exc.code(), exc.details()
    if code == grpc.StatusCode.INVALID_ARGUMENT:
        return ValueError(details)
    if code == grpc.StatusCode.FAILED_PRECONDITION:
        return StaleEpochError(details)
    if code in _RECOVERABLE:
        return AllocatorUnavailableError(f"{call}: {code.name}: {details}")
    return RemoteAllocatorError(f"{call}: {code.name}: {details}")

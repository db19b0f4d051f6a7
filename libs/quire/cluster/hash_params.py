"""How the router hashes prompts: the block size and extra key its executors announce. Pure.

Prefix routing only works when the router hashes a prompt's blocks exactly as the executors
(and their memory manager) do: same block size, same extra key. Each executor announces both
in its liveness record (`ExecutorRecord.block_size`, `.hash_extra_key`); the router takes them
from there, and uses its own flags only for records that announce nothing (older executors,
static `--executors` lists, Redis down).

Executors of one model that disagree are a configuration error that would otherwise show up
only as a silent zero hit rate. The rule then, documented and deterministic: the parameters
announced by the most executors win (ties: the group holding the smallest executor id); the
router hashes with those, reads prefix hits only from executors that agree, and still routes
to every live executor (the others just never count as holding a prefix). `HashAgreement`
says which parameters won and who disagrees; the router logs it, exports it as a metric and
shows it in /cluster/status.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from quire.cluster.redis_keys import ExecutorRecord


@dataclass(frozen=True, order=True)
class HashParams:
    """What a block hash depends on besides the tokens."""

    block_size: int  # tokens per KV block
    extra_key: str  # mixed into every block hash (the model id)

    def __post_init__(self) -> None:
        if self.block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {self.block_size}")


@dataclass(frozen=True)
class HashAgreement:
    """The parameters the router hashes with, and whether the executors agree on them."""

    params: HashParams
    source: str  # "executors" (announced in records) or "fallback" (the router's flags)
    # Executor ids by the parameters they hash with, every group of the view (sorted).
    groups: tuple[tuple[HashParams, tuple[str, ...]], ...] = ()

    @property
    def is_mismatch(self) -> bool:
        """True when the executors of the model hash blocks in more than one way."""
        return len(self.groups) > 1

    @property
    def agreeing(self) -> frozenset[str]:
        """Executors whose prefix sets hold hashes the router's hashes can match."""
        return frozenset(e for p, ids in self.groups if p == self.params for e in ids)

    @property
    def disagreeing(self) -> tuple[str, ...]:
        return tuple(sorted(e for p, ids in self.groups if p != self.params for e in ids))


def params_of(record: ExecutorRecord, fallback: HashParams) -> HashParams:
    """What one executor hashes with: its record's announcement, else the fallback's fields."""
    return HashParams(
        block_size=record.block_size or fallback.block_size,
        extra_key=fallback.extra_key if record.hash_extra_key is None else record.hash_extra_key,
    )


def resolve_hash_params(records: Sequence[ExecutorRecord], fallback: HashParams) -> HashAgreement:
    """The parameters to hash with over these executors (the rule in the module docstring)."""
    announced = [r for r in records if r.block_size is not None or r.hash_extra_key is not None]
    if not announced:
        ids = tuple(sorted(r.executor_id for r in records))
        return HashAgreement(fallback, "fallback", ((fallback, ids),) if ids else ())
    by_params: dict[HashParams, list[str]] = {}
    for record in records:
        by_params.setdefault(params_of(record, fallback), []).append(record.executor_id)
    groups = tuple(sorted((p, tuple(sorted(ids))) for p, ids in by_params.items()))
    winner = min(groups, key=lambda g: (-len(g[1]), g[1][0]))[0]
    return HashAgreement(winner, "executors", groups)

"""The block size and extra key the router hashes prompts with, taken from executor records.

`HashWatch.agreement(view)` resolves them once per cluster view (`quire.cluster.hash_params`)
and makes a disagreement loud: a warning in the log when it starts (and when it ends), the
`quire_router_hash_params_mismatch` gauge at 1, and the `hash_params` block of /cluster/status.
"""

from __future__ import annotations

import structlog

from quire.cluster.hash_params import HashAgreement, HashParams, resolve_hash_params
from services.router.directory import ClusterView
from services.router.router_metrics import RouterMetrics

log = structlog.get_logger("router.hash_params")


class HashWatch:
    """Resolves the hash parameters of each view; logs and counts disagreements."""

    def __init__(self, fallback: HashParams, metrics: RouterMetrics) -> None:
        self.fallback = fallback  # the router's flags, for records that announce nothing
        self.metrics = metrics
        self._view: ClusterView | None = None
        self._agreement = HashAgreement(fallback, "fallback")
        self._reported: HashAgreement | None = None

    def agreement(self, view: ClusterView) -> HashAgreement:
        """The parameters for this view (resolved once per view object)."""
        if view is not self._view:
            self._view = view
            self._agreement = resolve_hash_params(view.records, self.fallback)
            self._report(self._agreement)
        return self._agreement

    def _report(self, agreement: HashAgreement) -> None:
        if self._reported is not None and agreement.groups == self._reported.groups:
            return
        was_mismatch = self._reported is not None and self._reported.is_mismatch
        self._reported = agreement
        self.metrics.hash_params_mismatch.set(1 if agreement.is_mismatch else 0)
        self.metrics.hash_params_disagreeing.set(len(agreement.disagreeing))
        if agreement.is_mismatch:
            log.error(
                "executors of one model hash KV blocks differently; prefix hits are read only "
                "from the executors that announce the majority's parameters",
                block_size=agreement.params.block_size,
                extra_key=agreement.params.extra_key,
                groups=[
                    {"block_size": p.block_size, "extra_key": p.extra_key, "executors": list(ids)}
                    for p, ids in agreement.groups
                ],
                disagreeing=list(agreement.disagreeing),
            )
        elif was_mismatch:
            log.warning(
                "executors agree on block hashing again",
                block_size=agreement.params.block_size,
                extra_key=agreement.params.extra_key,
            )

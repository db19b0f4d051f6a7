"""Operations: GET /health (`router`, on both ports), /metrics and /cluster/status (`admin`,
on the admin port only)."""

from __future__ import annotations

from dataclasses import asdict

from fastapi import APIRouter, Response
from fastapi.responses import JSONResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from services.router.deps import StateDep
from services.router.errors import error_body
from services.router.schemas import ClusterStatus, ExecutorStatusOut, HashGroupOut, HashParamsOut

router = APIRouter(tags=["ops"])
admin = APIRouter(tags=["ops"])


@router.get("/health", response_model=None)
async def health(state: StateDep) -> JSONResponse:
    """200 while at least one live executor can take work, else 503."""
    view = await state.directory.view()
    down = state.directory.down_executors()
    live = [r for r in view.records if not r.draining and r.executor_id not in down]
    if not live:
        return JSONResponse(
            error_body(503, "no live executor", code="no_executor"), status_code=503
        )
    return JSONResponse({"status": "ok", "executors": len(live), "source": view.source})


@admin.get("/metrics")
async def metrics(state: StateDep) -> Response:
    """Prometheus text format."""
    # Refresh a stale executor view first, so the gauge tells what /health would answer now.
    await state.directory.view()
    state.metrics.healthy_executors.set(len(state.directory.cached_usable_executors()))
    return Response(generate_latest(state.metrics.registry), media_type=CONTENT_TYPE_LATEST)


@admin.get("/cluster/status")
async def cluster_status(state: StateDep) -> ClusterStatus:
    """Every executor in the registry, live or expired, with its load and block hashing."""
    view = await state.directory.view()
    agreement = state.dispatcher.hash_watch.agreement(view)
    down = state.directory.down_executors()
    executors = [
        ExecutorStatusOut(
            id=r.executor_id,
            address=r.address,
            healthy=not r.draining and r.executor_id not in down,
            block_size=r.block_size,
            hash_extra_key=r.hash_extra_key,
            **asdict(r.load),
        )
        for r in view.records
    ]
    executors += [ExecutorStatusOut(id=e, address="", healthy=False) for e in view.expired]
    hash_params = HashParamsOut(
        block_size=agreement.params.block_size,
        extra_key=agreement.params.extra_key,
        source=agreement.source,
        mismatch=agreement.is_mismatch,
        disagreeing=list(agreement.disagreeing),
        groups=[
            HashGroupOut(block_size=p.block_size, extra_key=p.extra_key, executors=list(ids))
            for p, ids in agreement.groups
        ],
    )
    return ClusterStatus(
        executors=executors,
        source=view.source,
        routing_policy=state.dispatcher.policy.name,
        hash_params=hash_params,
    )

"""GET /v1/models: the one model this router serves."""

from __future__ import annotations

from fastapi import APIRouter

from services.router.deps import StateDep
from services.router.schemas import ModelCard, ModelList

router = APIRouter(tags=["models"])


@router.get("/v1/models")
async def list_models(state: StateDep) -> ModelList:
    """OpenAI's model list."""
    return ModelList(
        data=[
            ModelCard(
                id=state.settings.model_name,
                root=state.settings.model,
                max_model_len=state.max_model_len,
            )
        ]
    )

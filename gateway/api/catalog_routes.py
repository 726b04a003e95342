"""``GET /v1/models``: the union of the workers' models (learned by the health loop)."""

from __future__ import annotations

from fastapi import APIRouter

from gateway.api.control import CLIENT_ERRORS, AppDeps, ControlRoute, add_get
from gateway.api.models import ModelCard, ModelList


async def list_models(deps: AppDeps) -> ModelList:
    """The union of the workers' ``/v1/models`` entries, first seen wins, in registration order."""
    return ModelList(data=[ModelCard.model_validate(card) for card in deps.fleet.model_cards()])


def catalog_router() -> APIRouter:
    """``GET /v1/models``."""
    router = APIRouter(tags=["openai"], route_class=ControlRoute, responses=CLIENT_ERRORS)
    add_get(router, "/v1/models", list_models, response_model=ModelList, operation_id="listModels")
    return router

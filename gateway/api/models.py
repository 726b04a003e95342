"""Request and response models of the control plane (``/admin/*``, ``/health``, ``/ready``, ``/v1/models``).

They type the FastAPI routes and feed the generated OpenAPI document. The completion routes do not use
them: those stay raw ASGI (``gateway.api.completion_docs`` only describes them).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictStr

from policies.api import Role


class ErrorDetail(BaseModel):
    """The inside of OpenAI's error body."""

    message: str
    type: str
    param: str | None
    code: str | None


class ErrorResponse(BaseModel):
    """OpenAI's error body; every error the gateway answers has this shape."""

    error: ErrorDetail


class HealthStatus(BaseModel):
    """``GET /health``: the process is up."""

    status: Literal["ok"] = "ok"


class ReadyStatus(BaseModel):
    """``GET /ready``: at least one worker can take traffic."""

    status: Literal["ready"] = "ready"
    healthy_workers: int


class ModelCard(BaseModel):
    """One worker's ``/v1/models`` entry, passed through as the worker wrote it (``id`` is guaranteed)."""

    model_config = ConfigDict(extra="allow")

    id: str


class ModelList(BaseModel):
    """``GET /v1/models``: the union of the workers' models, first seen wins."""

    object: Literal["list"] = "list"
    data: list[ModelCard]


class PoolInfo(BaseModel):
    """The PD pool a worker serves now (only when pool balancing runs)."""

    capable: str
    pool: str
    reason: str
    moves: int


class EngineInfo(BaseModel):
    """The engine behind a worker: what answers there, how its load is read, its cache facts."""

    kind: str
    configured: str
    detected_by: str
    version: str | None
    served_model: str | None
    load_signal: str
    load_note: str
    #: the path the load figures were last read from (None: never read)
    load_path: str | None = None
    #: seconds since they were read (None: never)
    load_age_s: float | None = None
    block_size: int
    block_size_source: str
    kv_capacity_tokens: int | None
    prefix_reuse: bool | None
    no_affinity_reason: str | None
    health: str
    parity_route: str | None
    #: whether its responses carry ``cached_tokens`` (None: not seen yet)
    reports_cached_tokens: bool | None = None
    #: where its prefix hits come from: precise (its KV events), approximate (learned from routing) or none
    index_mode: str = "none"
    #: the worker's KV-event feed (filled by the KV service; None where it keeps no feed)
    events: dict[str, Any] | None = None
    #: what the approximate index learned of it: gateway tokens per engine token, the assumed cache in
    #: the gateway's blocks and the correction from reported hits (None: nothing learned yet)
    units: dict[str, Any] | None = None


class WorkerInfo(BaseModel):
    """One worker as the gateway sees it, with its engine."""

    pool: PoolInfo | None
    id: str
    url: str
    role: str
    healthy: bool
    draining: bool
    breaker: str
    inflight: int
    running: int
    queue: int
    kv_usage: float
    cached_blocks: int
    models: list[str]
    engine: EngineInfo


class WorkerList(BaseModel):
    """``GET /admin/workers``."""

    workers: list[WorkerInfo]


class RegisterWorker(BaseModel):
    """``POST /admin/workers``: the worker gets traffic once a health probe passes."""

    url: StrictStr = Field(
        description="http(s)://HOST:PORT of the worker", examples=["http://127.0.0.1:8001"]
    )
    role: StrictStr = Field(default="both", json_schema_extra={"enum": [str(r) for r in Role]})
    # It becomes the x-kvgate-worker header of every reply the worker serves: printable ASCII only.
    id: StrictStr | None = Field(default=None, pattern=r"^[!-~]{0,128}$", description="defaults to HOST:PORT")


class RouteDecision(BaseModel):
    """What the policy chose."""

    worker: str | None
    prefill_worker: str | None
    reason: str


class WorkerScore(BaseModel):
    """One worker as the policy saw it for this request."""

    id: str
    healthy: bool
    score: float | None
    prefix_hit_tokens: int
    gpu_hit_blocks: int
    tier_hit_blocks: int
    inflight: int
    queue: int


class RouteExplanation(BaseModel):
    """``POST /admin/route``: the decision for a body and the snapshot it was made on."""

    decision: RouteDecision
    num_prompt_tokens: int
    num_blocks: int
    workers: list[WorkerScore]


class ProbeMismatch(BaseModel):
    """A parity probe whose token ids differ between the gateway and the worker."""

    probe: str
    first_difference: int | None


class ProbeFailure(BaseModel):
    """A parity probe that could not be compared (the worker or the local side failed)."""

    probe: str
    error: str | None


class WorkerParity(BaseModel):
    """The tokenizer parity of one worker."""

    worker: str
    ok: bool
    mismatches: list[ProbeMismatch]
    errors: list[ProbeFailure]
    #: why the worker was not probed at all (its engine has no tokenize route), else None
    skipped: str | None = None
    #: probes left out for this engine, each with the reason
    skipped_probes: list[dict[str, str]] = []


class ParityResult(BaseModel):
    """``POST /admin/parity``: ``checked`` is false when there was nothing to check."""

    checked: bool
    ok: bool
    workers: list[WorkerParity]

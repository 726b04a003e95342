"""The picker's request path, the gateway's own: parse → render → tokenize → hash → index lookup → policy.

``EndpointPicker.pick`` turns a buffered request into a ``Pick``: the worker the policy chose (the same
``Router.prepare`` / ``Router.route`` the HTTP gateway calls, so the same tokenizer, KV index, load board
and policy decide), named as the ``host:port`` Envoy connects to, with optional fallbacks. It raises the
gateway's typed errors (``gateway.errors``); ``gateway.epp.stream`` turns them into immediate responses.
The in-flight accounting of a pick lives in ``gateway.epp.accounting``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from gateway.analyze.offload import LargeBodyOffload
from gateway.epp.endpoints import endpoint_of
from gateway.epp.routes import other_route, prompt_endpoint
from gateway.errors import InvalidRequest, NoHealthyWorker, RateLimited
from gateway.fleet.registry import Fleet
from gateway.openai.schema import ParsedRequest, parse_balanced, parse_request
from gateway.proxy.sticky import ResponseAffinity
from gateway.routing.router import Routed, Router
from gateway.state.protocols import LoadBoard
from policies.api import RouteRequest


@dataclass(frozen=True, slots=True)
class PickerConfig:
    """How the picker decides beyond the policy.

    Attributes:
        max_tokens_limit: the largest ``max_tokens`` accepted (as in the gateway).
        fallbacks: endpoints named after the pick, for a data plane that retries down the list (0: none;
            a list breaks ``ORIGINAL_DST`` clusters, so it is off by default).
        max_inflight: per endpoint; when every eligible endpoint holds this many requests the picker sheds
            with 429 (0: never).
    """

    max_tokens_limit: int = 1_000_000
    fallbacks: int = 0
    max_inflight: int = 0


@dataclass(frozen=True, slots=True)
class PickRequest:
    """A request as the data plane handed it over: method, path, headers, whole body (None: no body), and
    the data plane's subset hint (None: every endpoint is eligible)."""

    method: str
    path: str
    headers: Mapping[str, str]
    body: bytes | None
    subset: frozenset[str] | None = None


@dataclass(frozen=True, slots=True)
class Pick:
    """The answer: endpoints to name (the pick first), the routing record, and the work it brings."""

    endpoints: tuple[str, ...]
    routed: Routed
    parsed: ParsedRequest
    tokens: int


class EndpointPicker:
    """Chooses the endpoint of each request through the gateway's router.

    Args:
        router: the gateway's router (policy, index, load snapshot).
        fleet: the endpoints.
        load: the in-flight accounting the shedding check reads.
        affinity: where stored Responses API responses live (``previous_response_id`` pins there).
        config: fallbacks and shedding.
        offload: where bodies above its ``inline_bytes`` are parsed and analysed, off the event loop (the
            gateway's; a default one when None).
    """

    def __init__(
        self,
        *,
        router: Router,
        fleet: Fleet,
        load: LoadBoard,
        affinity: ResponseAffinity | None,
        config: PickerConfig,
        offload: LargeBodyOffload | None = None,
    ) -> None:
        self._offload = offload if offload is not None else LargeBodyOffload()
        self._router = router
        self._fleet = fleet
        self._load = load
        self._affinity = affinity
        self._config = config

    async def pick(self, request: PickRequest) -> Pick:
        """Choose the endpoint(s) for ``request`` and record the choice (the router's bookkeeping).

        Raises:
            InvalidRequest: the body is not a valid request for its route (400).
            ModelNotFound: no endpoint serves the model (404).
            RateLimited: every eligible endpoint is at ``max_inflight`` (429).
            NoHealthyWorker: no eligible endpoint (503), also when the subset hint leaves none.
        """
        # a large body is parsed and analysed off the loop (``gateway.analyze.offload``)
        parsed, req = await self._offload.analysed(request.body or b"", lambda: self._analyse(request))
        exclude = self._outside(request.subset)
        self._check_capacity(parsed.model, exclude)
        if parsed.previous_response_id is not None and self._affinity is not None:
            owner = await self._affinity.owner(
                parsed.previous_response_id, parsed.model, param="previous_response_id"
            )
            routed = self._router.route_to(req, owner, "previous_response_id")
        else:
            routed = self._router.route(req, exclude, balanced=parsed.endpoint is None)
        endpoints = (endpoint_of(routed.record.url), *self._fallbacks(routed, exclude))
        return Pick(endpoints, routed, parsed, routed.uncached_tokens + (parsed.max_tokens or 0))

    def _analyse(self, request: PickRequest) -> tuple[ParsedRequest, RouteRequest]:
        parsed = self._parse(request)
        return parsed, self._router.prepare(parsed, request.headers)

    def _parse(self, request: PickRequest) -> ParsedRequest:
        endpoint = prompt_endpoint(request.path) if request.method == "POST" else None
        if endpoint is not None:
            if not request.body:
                raise InvalidRequest("the request has no body; send a JSON object")
            return parse_request(request.body, endpoint, max_tokens_limit=self._config.max_tokens_limit)
        return parse_balanced(request.body or b"", other_route(request.path), require_model=False)

    def _outside(self, subset: frozenset[str] | None) -> list[str]:
        """The endpoints the subset hint rules out.

        Raises:
            NoHealthyWorker: the hint names no endpoint of the pool.
        """
        if subset is None:
            return []
        outside = [r.id for r in self._fleet if endpoint_of(r.url) not in subset]
        if len(outside) == len(self._fleet):
            raise NoHealthyWorker(f"no endpoint of the pool is in the subset {sorted(subset)}")
        return outside

    def _check_capacity(self, model: str, exclude: list[str]) -> None:
        limit = self._config.max_inflight
        if limit <= 0:
            return
        eligible = [r for r in self._fleet.serving(model or None) if r.available and r.id not in exclude]
        if eligible and all(self._load.get(r.id).inflight_requests >= limit for r in eligible):
            raise RateLimited(
                f"every endpoint serving {model!r} holds {limit} requests (--max-inflight); retry later",
                retry_after_s=1,
            )

    def _fallbacks(self, routed: Routed, exclude: list[str]) -> list[str]:
        """Up to ``fallbacks`` other available endpoints: best policy score first, then the rest."""
        if self._config.fallbacks <= 0:
            return []
        scores = routed.decision.scores
        others = [
            r for r in self._fleet.serving(routed.request.model or None)
            if r.available and r.id != routed.record.id and r.id not in exclude
        ]  # fmt: skip
        others.sort(key=lambda r: -scores.get(r.id, 0.0))  # type: ignore[call-overload]
        return [endpoint_of(r.url) for r in others[: self._config.fallbacks]]

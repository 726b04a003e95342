"""kvgate routing policies: the API, the pipeline runtime, the built-ins and plugin discovery.

``kvgate_core`` is imported first: its guard decides whether the compiled modules load
(``kvgate_core.native``).
"""

import kvgate_core  # noqa: F401
from policies.api import (
    Decider,
    Decision,
    Filter,
    Need,
    Observer,
    Outcome,
    Picker,
    Policy,
    PolicyContext,
    PolicyFactory,
    Role,
    RouteRequest,
    Scorer,
    WorkerId,
    WorkerView,
)
from policies.candidates import DECODE_ROLES, PREFILL_ROLES, SERVING_ROLES, candidates
from policies.config import PluginSpec, PolicyConfigError, PolicySpec, parse_params, parse_policy_spec
from policies.pd import PDPolicy
from policies.pipeline import Pipeline
from policies.plugins import Kind, PluginDef
from policies.registry import PolicyRegistry, available_policies, build_policy, make_registry

__all__ = [
    "DECODE_ROLES",
    "PREFILL_ROLES",
    "SERVING_ROLES",
    "Decider",
    "Decision",
    "Filter",
    "Kind",
    "Need",
    "Observer",
    "Outcome",
    "PDPolicy",
    "Picker",
    "Pipeline",
    "PluginDef",
    "PluginSpec",
    "Policy",
    "PolicyConfigError",
    "PolicyContext",
    "PolicyFactory",
    "PolicyRegistry",
    "PolicySpec",
    "Role",
    "RouteRequest",
    "Scorer",
    "WorkerId",
    "WorkerView",
    "available_policies",
    "build_policy",
    "candidates",
    "make_registry",
    "parse_params",
    "parse_policy_spec",
]

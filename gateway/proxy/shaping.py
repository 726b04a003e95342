"""Per-engine request shaping: the body one attempt sends to one worker, and how to read its stream.
Compiled with mypyc (``docs/development.md``: what that rules out).

Pure: ``shape(parsed, raw, facts, want_usage=…)`` looks at the parsed request and the worker's
``EngineFacts`` and returns the upstream body plus the stream handling it implies. Each attempt shapes for
its own worker, so a retry on another engine gets that engine's body. For kvgate's own workers, and workers
whose engine is not detected yet (``auto``), it returns None at once: the client's original bytes go
upstream and the stream is relayed as before (no per-request cost beyond one set lookup).

What changes for the other engines (``gateway.engines.profiles`` says which does what):

- ``stream_options.include_usage`` is injected into a streamed request whose client did not ask for it,
  when the engine can report usage and somebody in the gateway reads it (``want_usage``: the drift
  feedback or an observing policy). The usage chunk the engine then adds is dropped before it reaches the
  client (``strip_usage_chunk``); its ``cached_tokens`` still reaches the gateway's accounting. The client's
  other ``stream_options`` keys stay, except ``continuous_usage_stats``: it only takes effect together with
  ``include_usage``, so keeping it would put usage on every chunk the client sees.
- ``model`` becomes the engine's served name where the engine requires it exactly (DeepSpeed-MII answers
  400 otherwise). The client then sees whatever ``model`` the engine answers with: the served name, not
  the name the client sent; the gateway does not rewrite responses.
"""

from __future__ import annotations

from typing import Any, Final, NamedTuple

import orjson

from gateway.engines.profiles import EngineFacts, EngineKind
from gateway.openai.schema import ParsedRequest

#: engines whose requests go upstream as the client sent them
_AS_IS: Final = frozenset({EngineKind.KVGATE, EngineKind.AUTO})


class Shaped(NamedTuple):
    """One attempt's upstream body and how to relay its stream.

    Attributes:
        body: the bytes to send (the client's own bytes when nothing changed).
        strip_usage_chunk: drop the stream's usage chunk (``"choices": []`` + ``usage``) before the client.
    """

    body: bytes
    strip_usage_chunk: bool = False


def shape(parsed: ParsedRequest, raw: bytes, facts: EngineFacts, *, want_usage: bool) -> Shaped | None:
    """The body to send to the worker described by ``facts`` (``raw``: the client's bytes of ``parsed``);
    None: send ``raw`` and relay as for kvgate's own workers."""
    if facts.kind in _AS_IS:
        return None
    profile = facts.profile
    changes: dict[str, Any] = {}
    strip = False
    if parsed.stream and want_usage and profile.inject_include_usage and profile.stream_usage:
        options = parsed.body.get("stream_options")
        asked = isinstance(options, dict) and options.get("include_usage") is True
        if not asked:
            changes["stream_options"] = _with_usage(options)
            strip = True
    served = facts.served_model
    if profile.rewrite_model and served and served != parsed.model:
        changes["model"] = served
    body = orjson.dumps({**parsed.body, **changes}) if changes else raw
    return Shaped(body, strip_usage_chunk=strip)


def _with_usage(options: object) -> dict[str, Any]:
    """The client's ``stream_options`` with ``include_usage`` on (see the module docstring)."""
    kept: dict[str, Any] = dict(options) if isinstance(options, dict) else {}
    kept.pop("continuous_usage_stats", None)
    kept["include_usage"] = True
    return kept

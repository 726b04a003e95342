"""The names vLLM's adapter had before one decoder served three engines (kept for existing importers).

New code imports from ``decode`` (wire format), ``rechunk`` (re-hashing at any block size) and ``feeds``.
"""

from __future__ import annotations

from gateway.kvindex.adapters.decode import EngineEvent, decode_batch
from gateway.kvindex.adapters.rechunk import EngineEventTranslator, TranslatorConfig

__all__ = ["EngineEvent", "EngineEventTranslator", "TranslatorConfig", "decode_batch"]

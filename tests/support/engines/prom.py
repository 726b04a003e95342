"""Prometheus text exposition (format 0.0.4) for the fakes' ``/metrics``: gauges and counters with labels."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from starlette.responses import Response

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


@dataclass(frozen=True, slots=True)
class Sample:
    """One metric sample; ``kind`` is ``gauge`` or ``counter``."""

    name: str
    value: float
    help: str = ""
    kind: str = "gauge"
    labels: Mapping[str, str] = field(default_factory=dict)


def _labels(labels: Mapping[str, str]) -> str:
    if not labels:
        return ""
    inner = ",".join(f'{k}="{v}"' for k, v in labels.items())
    return "{" + inner + "}"


def render(samples: Iterable[Sample]) -> bytes:
    """The exposition text: a HELP and TYPE line before the first sample of each name."""
    lines: list[str] = []
    seen: set[str] = set()
    for s in samples:
        if s.name not in seen:
            seen.add(s.name)
            lines.append(f"# HELP {s.name} {s.help or s.name}")
            lines.append(f"# TYPE {s.name} {s.kind}")
        lines.append(f"{s.name}{_labels(s.labels)} {float(s.value)!r}")
    return ("\n".join(lines) + "\n").encode()


def metrics_response(samples: Iterable[Sample]) -> Response:
    return Response(render(samples), media_type=CONTENT_TYPE)

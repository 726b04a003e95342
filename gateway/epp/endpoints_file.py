"""The endpoints file: the picker's endpoints on bare metal, re-read when it changes.

Accepted shapes (the first that fits):

- YAML list: ``- http://10.0.0.7:8000#engine=vllm`` or ``- 10.0.0.7:8000``;
- YAML mapping ``endpoints:`` holding such strings or llm-d file-discovery items ``{address, port}``;
- plain text: one worker URL (``kvgate gateway --worker`` syntax) or ``host:port`` per line; blank lines
  and lines starting with ``#`` are skipped.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from gateway.epp.endpoints import url_of
from gateway.errors import ConfigError
from gateway.settings import WorkerSpec, parse_worker


def parse_endpoints(text: str, source: str = "endpoints file") -> tuple[WorkerSpec, ...]:
    """The workers ``text`` lists.

    Raises:
        ConfigError: an entry is not a worker URL, ``host:port`` or ``{address, port}``.
    """
    try:
        data: Any = yaml.safe_load(text)
    except yaml.YAMLError:
        data = None
    if isinstance(data, dict):
        data = data.get("endpoints")
        if not isinstance(data, list):
            raise ConfigError(f"{source}: a mapping must hold 'endpoints:' as a list")
    items = data if isinstance(data, list) else _lines(text)
    return tuple(parse_worker(url_of(_entry(item, source))) for item in items)


def _lines(text: str) -> list[str]:
    return [s for line in text.splitlines() if (s := line.strip()) and not s.startswith("#")]


def _entry(item: object, source: str) -> str:
    if isinstance(item, str):
        return item.strip()
    if isinstance(item, dict) and "address" in item and "port" in item:
        return f"{item['address']}:{item['port']}"
    raise ConfigError(f"{source}: {item!r} is not a worker URL, host:port or {{address, port}}")


class EndpointsFile:
    """An endpoints file, read again only once its modification time changed.

    Args:
        path: the file.
    """

    def __init__(self, path: str) -> None:
        self._path = Path(path)
        self._mtime_ns: int | None = None

    @property
    def name(self) -> str:
        return f"endpoints file {self._path}"

    async def read(self) -> Sequence[WorkerSpec] | None:
        """The workers it lists, or None when it has not changed since the last read.

        Raises:
            ConfigError: it cannot be read or parsed.
        """
        try:
            mtime = self._path.stat().st_mtime_ns
            if mtime == self._mtime_ns:
                return None
            text = self._path.read_text(encoding="utf-8")
        except OSError as exc:
            raise ConfigError(f"{self.name}: cannot read it ({exc.strerror})") from None
        self._mtime_ns = mtime
        return parse_endpoints(text, self.name)

"""Rebuilds an SSD tier's LRU index from the block files already in its directory."""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

logger = logging.getLogger(__name__)

STALE_TMP_S = 600.0  # a temp file this old belongs to a writer that died; younger ones may be in flight


def _block_hash(name: str) -> int | None:
    stem, dot, ext = name.partition(".")
    if ext != "kv" or not dot or len(stem) != 16:
        return None
    try:
        return int(stem, 16)
    except ValueError:
        return None


def scan_blocks(model_root: Path, *, now: float | None = None) -> list[tuple[int, int]]:
    """``(hash, size)`` of every block file under ``model_root``, least recently used first.

    Recency is ``max(atime, mtime)``: with ``relatime`` mounts atime is coarse, so the order is
    approximate, which is all an LRU rebuilt after a restart needs. Stale temp files are deleted.
    """
    now = time.time() if now is None else now
    found: list[tuple[float, int, int]] = []
    if not model_root.is_dir():
        return []
    for sub in os.scandir(model_root):
        if not sub.is_dir(follow_symlinks=False):
            continue
        for entry in os.scandir(sub.path):
            try:
                st = entry.stat(follow_symlinks=False)
            except FileNotFoundError:
                continue
            if entry.name.endswith(".tmp"):
                if now - st.st_mtime > STALE_TMP_S:
                    Path(entry.path).unlink(missing_ok=True)
                continue
            block_hash = _block_hash(entry.name)
            if block_hash is not None:
                found.append((max(st.st_atime, st.st_mtime), block_hash, st.st_size))
    found.sort()
    logger.info("SSD tier %s: %d block files found", model_root, len(found))
    return [(h, size) for _, h, size in found]

"""The repository stands alone: no file points at documents outside it (the notes a team keeps beside a
checkout are not in a clone), and the data its tests and benchmarks replay lives inside it."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from loadtest.trace import MOONCAKE_TRACE, read_trace

ROOT = Path(__file__).resolve().parents[2]
#: a relative path that climbs (``../x``), and a document named in capitals (``README.md``)
_CLIMB = re.compile(r"(?:\.\./)+[\w.{}*-]*")
_DOC = re.compile(r"\b[A-Z][A-Z_]+\.md\b")


def _tracked() -> list[Path]:
    out = subprocess.run(["git", "-C", str(ROOT), "ls-files"], capture_output=True, text=True, check=True)
    return [ROOT / line for line in out.stdout.splitlines() if line and not line.endswith(".gz")]


def test_no_file_refers_to_documents_outside_the_repository() -> None:
    """No relative path climbs out of the repository (the notes a team keeps beside a checkout), and every
    document named in capitals (``README.md``…) is one the repository holds."""
    files = _tracked()
    held = {p.name for p in files}
    found = []
    for path in files:
        if not path.is_file():
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue  # binary (images)
        for climb in _CLIMB.findall(text):
            if not (path.parent / climb).resolve().is_relative_to(ROOT):
                found.append(f"{path.relative_to(ROOT)}: {climb}")
        found += [f"{path.relative_to(ROOT)}: {d}" for d in _DOC.findall(text) if d not in held]
    assert not found, found


def test_the_replayed_trace_is_in_the_repository() -> None:
    assert MOONCAKE_TRACE.is_relative_to(ROOT)
    records = list(read_trace(MOONCAKE_TRACE))
    assert len(records) == 12_031
    assert (MOONCAKE_TRACE.parent / "README.md").read_text().count("Apache-2.0") == 1

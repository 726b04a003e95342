"""The repository stands alone: no file points at documents outside it (the notes a team keeps beside a
checkout are not in a clone), and the data its tests and benchmarks replay lives inside it."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from loadtest.trace import MOONCAKE_TRACE, read_trace

ROOT = Path(__file__).resolve().parents[2]
#: names of documents that live outside the repository, and paths that climb out of it to reach them
_OUTSIDE = re.compile(
    r"\.\./shared\b|(?<![\w/])(ENGINES|GIE|STYLE|ARCHITECTURE|PERFORMANCE)\.md\b|STYLE §|ENGINES §|GIE §"
)


def _tracked() -> list[Path]:
    out = subprocess.run(["git", "-C", str(ROOT), "ls-files"], capture_output=True, text=True, check=True)
    return [ROOT / line for line in out.stdout.splitlines() if line and not line.endswith(".gz")]


def test_no_file_refers_to_documents_outside_the_repository() -> None:
    found = []
    for path in _tracked():
        if path == Path(__file__) or not path.is_file():
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue  # binary (images)
        found += [f"{path.relative_to(ROOT)}:{m.group(0)}" for m in _OUTSIDE.finditer(text)]
    assert not found, found


def test_the_replayed_trace_is_in_the_repository() -> None:
    assert MOONCAKE_TRACE.is_relative_to(ROOT)
    records = list(read_trace(MOONCAKE_TRACE))
    assert len(records) == 12_031
    assert (MOONCAKE_TRACE.parent / "README.md").read_text().count("Apache-2.0") == 1

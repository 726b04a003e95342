"""Write the gateway's OpenAPI document without running a server: ``python -m gateway.api.openapi [FILE]``.

The running gateway serves the same document at ``GET /openapi.json``; it is generated from the routes
(``gateway.api.application``), so this is the way to get it into a file (docs, client generators).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

import orjson

from gateway.api.application import build_gateway_app


def document_bytes() -> bytes:
    """The OpenAPI document as indented JSON."""
    return orjson.dumps(build_gateway_app().openapi(), option=orjson.OPT_INDENT_2) + b"\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gateway.api.openapi", description=__doc__)
    parser.add_argument("file", nargs="?", help="where to write it (default: standard output)")
    args = parser.parse_args(argv)
    if args.file is None:
        sys.stdout.buffer.write(document_bytes())
    else:
        Path(args.file).write_bytes(document_bytes())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

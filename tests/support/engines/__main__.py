"""``python -m tests.support.engines ENGINE --port N …`` (see ``tests.support.engines.runner``)."""

from tests.support.engines.runner import main

main()

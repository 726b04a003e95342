"""The chunks of a request's ``n`` choices, merged into one stream of ``(index, chunk)`` as they come.

One choice is iterated directly; several are raced with one pending ``__anext__`` task per choice, so a
slow choice never holds back the others. The merge owns those tasks and cancels them when it ends early
(the consumer still closes the engine streams themselves).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Sequence

from workers.engine_api import GenerationChunk, GenerationStream


async def merge_choices(
    streams: Sequence[GenerationStream],
) -> AsyncGenerator[tuple[int, GenerationChunk], None]:
    """Yield ``(choice index, chunk)`` from every stream until each has sent its final chunk.

    An engine error of any choice propagates (the other choices' pending reads are cancelled).
    """
    if len(streams) == 1:
        async for chunk in streams[0]:
            yield 0, chunk
        return
    pending = {_next(stream): i for i, stream in enumerate(streams)}
    try:
        while pending:
            done, _ = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            for task in sorted(done, key=pending.__getitem__):
                index = pending.pop(task)
                try:
                    chunk = task.result()
                except StopAsyncIteration:
                    continue
                yield index, chunk
                if chunk.finish_reason is None:
                    pending[_next(streams[index])] = index
    finally:
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)


def _next(stream: GenerationStream) -> asyncio.Future[GenerationChunk]:
    return asyncio.ensure_future(anext(stream))

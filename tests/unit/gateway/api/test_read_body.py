"""``read_body``: a body is whole only when the server says so; a disconnect before that voids it (the
uvicorn path read ``http.disconnect`` as the end and forwarded a truncated body)."""

from __future__ import annotations

import pytest

from gateway.api.openai_routes import read_body
from gateway.errors import BodyTooLarge, ClientGone
from kvgate_core.asgi import Message, Receive


def _receiving(*messages: Message) -> Receive:
    pending = list(messages)

    async def receive() -> Message:
        return pending.pop(0)

    return receive


async def test_parts_are_joined_until_more_body_is_false() -> None:
    receive = _receiving(
        {"type": "http.request", "body": b'{"a":', "more_body": True},
        {"type": "http.request", "body": b"1}", "more_body": False},
    )
    assert await read_body(receive, 100) == b'{"a":1}'


@pytest.mark.parametrize("first_part", [True, False])
async def test_a_disconnect_before_the_last_part_voids_the_body(first_part: bool) -> None:
    parts: list[Message] = (
        [{"type": "http.request", "body": b'{"a":', "more_body": True}] if first_part else []
    )
    receive = _receiving(*parts, {"type": "http.disconnect"})
    with pytest.raises(ClientGone):
        await read_body(receive, 100)


async def test_the_limit_holds_as_parts_arrive() -> None:
    receive = _receiving(
        {"type": "http.request", "body": b"x" * 60, "more_body": True},
        {"type": "http.request", "body": b"x" * 60, "more_body": True},
    )
    with pytest.raises(BodyTooLarge):
        await read_body(receive, 100)

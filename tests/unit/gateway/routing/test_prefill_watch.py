"""Which in-flight requests still wait for their first token: per worker, own and other replicas'."""

from __future__ import annotations

from gateway.routing.prefill_watch import PrefillWatch


def test_nothing_is_known_until_a_first_token_is_reported() -> None:
    watch = PrefillWatch(clock=lambda: 0.0)
    watch.open("w", prefill=300, tokens=310)
    assert not watch.reporting and watch.prefill_tokens("w", 310) is None


def test_a_request_is_pending_prefill_until_its_first_token() -> None:
    watch = PrefillWatch(clock=lambda: 0.0)
    a = watch.open("w", prefill=300, tokens=310)
    b = watch.open("w", prefill=100, tokens=110)
    watch.first_token(a)
    assert watch.reporting
    assert watch.prefill_tokens("w", 420) == 100  # a decodes, b still waits
    watch.first_token(a)  # again: nothing
    assert watch.prefill_tokens("w", 420) == 100
    watch.close(b)  # ended (a whole answer: no first token seen apart)
    assert watch.prefill_tokens("w", 310) == 0
    watch.close(a)
    watch.close(a)  # again: nothing
    assert watch.prefill_tokens("w", 0) == 0


def test_other_replicas_in_flight_tokens_count_as_not_past_their_first_token() -> None:
    watch = PrefillWatch(clock=lambda: 0.0)
    mine = watch.open("w", prefill=300, tokens=310)
    watch.first_token(mine)
    # the board says 1,310 in flight: 310 are this gateway's (decoding), 1,000 another replica's
    assert watch.prefill_tokens("w", 1_310) == 1_000
    assert watch.prefill_tokens("idle", 500) == 500  # a worker only others sent to
    assert watch.prefill_tokens("w", 100) == 0  # the board lags this gateway's own count: never negative


def test_a_ticket_never_closed_expires() -> None:
    now = [0.0]
    watch = PrefillWatch(max_age_s=60.0, clock=lambda: now[0])
    watch.first_token(watch.open("w", prefill=10, tokens=10))
    leaked = watch.open("w", prefill=500, tokens=510)  # a path that never closes it
    now[0] = 30.0
    assert watch.prefill_tokens("w", 520) == 500
    now[0] = 61.0
    assert watch.prefill_tokens("w", 0) == 0  # dropped past the deadline, with the older one
    assert not leaked.open

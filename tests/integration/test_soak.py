"""A one-minute soak: steady mixed load while two workers and Redis are restarted; nothing lost, no growth.

Runs ``loadtest.soak.run_soak`` (the same run as ``python -m loadtest.soak``) for 60 s at 15 requests/s
(chat and completions, streaming and not) through one gateway with Redis state and 3 sim workers, with the
compressed schedule of a one-minute run: worker 0 SIGKILLed and restarted at 20 s, Redis at 30 s, worker 1
at 40 s. Rows every 10 s; the first is the warm-up and the baseline.

Thresholds, chosen to catch leaks rather than noise on a shared 2-core machine:

- **no request lost**: every request ends ok, shed (503 + Retry-After) or as a stream cut with an error
  event; any other failure (a 502, a refused connection, a truncated stream, a timeout) fails the test.
  This is exact, not statistical: the gateway retries a killed worker's requests before their first byte.
- **open fds grow by at most 10 + 10% of the baseline** (about 16 on a baseline of about 60): the figure is
  the fewest fds seen in an interval (sampled every 0.5 s), so most in-flight requests drop out; what is
  left moves with the upstream pool's keep-alive connections, which a restarted worker's pool regrows:
  -6 to +6 over five healthy runs. A per-request leak (a client or upstream socket, a Redis connection
  never closed) adds hundreds in the minute's 900 requests. A leak of one fd per restart hides in the
  slack of three restarts; the long soak (``python -m loadtest.soak --minutes 30``: 14 worker and 5 Redis
  restarts, flat within 5%) is the check for those.
- **RSS grows by at most 25% after warm-up**: a healthy run moves by under 1% (allocator arenas, the KV
  index refilling after a restart). 25% leaves room for a GC or an arena step on a loaded machine and still
  fails a leak of about 33 KiB or more per request (750 requests after warm-up, a gateway of about 98 MiB);
  smaller per-request leaks are again the long soak's to show.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from loadtest.soak import SoakConfig, run_soak
from loadtest.soak_model import format_summary

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(240)]

FDS_SLACK = 10
FDS_PCT = 10.0
RSS_PCT = 25.0


def test_a_one_minute_soak_loses_nothing_and_stays_flat(tmp_path: Path) -> None:
    cfg = SoakConfig(duration_s=60, interval_s=10, workers=3, rate=15, log_dir=tmp_path)
    result = run_soak(cfg)
    summary = format_summary(result)

    assert result.restarts == ("worker 0 at 20s", "redis at 30s", "worker 1 at 40s"), summary
    assert result.totals.total == 60 * 15, summary  # every request sent got an answer of some kind
    assert result.lost == 0, summary
    assert result.totals.ok >= result.totals.total * 0.9, summary
    assert len(result.rows) == 6
    base_fds = result.rows[0].fds_min
    assert result.fds_growth <= FDS_SLACK + base_fds * FDS_PCT / 100, summary
    assert result.rss_growth_pct <= RSS_PCT, summary

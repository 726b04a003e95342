"""``kvgate_replica_lag_seconds``: the replica-lag recorders as one Prometheus histogram per kind."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from gateway.observability.metrics import Metrics
from gateway.state.lag import LagRecorder


def test_each_kind_is_exposed_as_a_cumulative_histogram() -> None:
    load, prediction = LagRecorder(), LagRecorder()
    for seconds in (0.004, 0.009, 0.3):
        load.observe(seconds)
    prediction.observe(0.0012)
    metrics = Metrics()
    metrics.attach_replica_lag({"load": load, "prediction": prediction})
    samples = {
        (s.name, s.labels.get("kind"), s.labels.get("le")): s.value
        for family in text_string_to_metric_families(metrics.render().decode())
        if family.name == "kvgate_replica_lag_seconds"
        for s in family.samples
    }
    assert samples[("kvgate_replica_lag_seconds_bucket", "load", "0.005")] == 1
    assert samples[("kvgate_replica_lag_seconds_bucket", "load", "0.01")] == 2
    assert samples[("kvgate_replica_lag_seconds_bucket", "load", "+Inf")] == 3
    assert samples[("kvgate_replica_lag_seconds_count", "load", None)] == 3
    assert samples[("kvgate_replica_lag_seconds_sum", "load", None)] == 0.004 + 0.009 + 0.3
    assert samples[("kvgate_replica_lag_seconds_bucket", "prediction", "0.002")] == 1
    assert samples[("kvgate_replica_lag_seconds_bucket", "prediction", "0.001")] == 0
    load.observe(0.001)  # read at scrape time: a later scrape sees later observations
    assert b'kvgate_replica_lag_seconds_count{kind="load"} 4.0' in metrics.render()


def test_a_gateway_without_shared_state_declares_the_family_without_samples() -> None:
    metrics = Metrics()
    metrics.attach_replica_lag({})
    families = [
        f for f in text_string_to_metric_families(metrics.render().decode()) if "replica_lag" in f.name
    ]
    assert [(f.name, f.type, f.samples) for f in families] == [
        ("kvgate_replica_lag_seconds", "histogram", [])
    ]

from __future__ import annotations

from prometheus_client import CollectorRegistry

from gateway.kvindex.feedback import FeedbackConfig, PrefixFeedback

CONFIG = FeedbackConfig(window=10, min_samples=5, min_realised_ratio=0.5)


def value(registry: CollectorRegistry, name: str) -> float:
    found = registry.get_sample_value(name)
    assert found is not None, name
    return found


def drifting(feedback: PrefixFeedback) -> bool:
    return feedback.drift


def test_materialised_predictions_raise_no_drift() -> None:
    registry = CollectorRegistry()
    feedback = PrefixFeedback(registry, CONFIG)
    for _ in range(10):
        feedback.record(predicted_tokens=256, best_tokens=256, reported_cached_tokens=256)
    assert not feedback.drift
    assert feedback.realised_ratio == 1.0
    assert value(registry, "kvgate_prefix_realised_tokens_total") == 2560
    assert value(registry, "kvgate_prefix_drift") == 0


def test_predictions_that_do_not_materialise_flag_drift_and_recover() -> None:
    registry = CollectorRegistry()
    feedback = PrefixFeedback(registry, CONFIG)
    for _ in range(4):
        feedback.record(256, 256, 0)
    assert not drifting(feedback)  # too few samples for a verdict
    feedback.record(256, 256, 0)
    assert drifting(feedback)
    assert value(registry, "kvgate_prefix_drift") == 1
    for _ in range(10):  # the window slides past the bad requests
        feedback.record(256, 256, 300)
    assert not feedback.drift
    assert value(registry, "kvgate_prefix_drift") == 0


def test_unreported_and_zero_predictions_do_not_count_towards_drift() -> None:
    registry = CollectorRegistry()
    feedback = PrefixFeedback(registry, CONFIG)
    for _ in range(20):
        feedback.record(256, 512, None)
        feedback.record(0, 0, 0)
    assert not feedback.drift
    assert feedback.realised_ratio is None
    assert value(registry, "kvgate_prefix_unreported_requests_total") == 20
    assert value(registry, "kvgate_prefix_best_tokens_sum") == 20 * 512


def test_two_apps_can_each_own_a_registry() -> None:
    PrefixFeedback(CollectorRegistry())
    PrefixFeedback(CollectorRegistry())

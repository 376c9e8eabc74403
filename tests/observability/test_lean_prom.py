"""The node path's Prometheus collectors (observability/lean_prom.py) expose exactly what
prometheus-client's Counter, Gauge and Histogram expose for the same observations."""

from __future__ import annotations

import threading

import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.openmetrics.exposition import generate_latest as openmetrics_latest
from prometheus_client.openmetrics.parser import text_string_to_metric_families

from flowscope.observability.lean_prom import LeanCounter, LeanGauge, LeanHistogram

BUCKETS = (0.1, 0.5, 1.0, 5.0)
VALUES = [0.0, 0.05, 0.1, 0.1000001, 0.5, 0.7, 1.0, 3.0, 5.0, 7.5, 1e9]


def samples(registry: CollectorRegistry) -> list[tuple[str, tuple, float]]:
    out = []
    for family in registry.collect():
        for s in family.samples:
            if not s.name.endswith("_created"):
                out.append((s.name, tuple(sorted(s.labels.items())), s.value))
    return sorted(out)


def pair() -> tuple[CollectorRegistry, CollectorRegistry]:
    return CollectorRegistry(), CollectorRegistry()


def test_the_same_samples_as_prometheus_client_for_the_same_observations():
    theirs, ours = pair()
    c1, c2 = Counter("runs", "h", ["w", "o"], registry=theirs), LeanCounter("runs", "h", ["w", "o"], ours)
    g1, g2 = Gauge("running", "h", ["w"], registry=theirs), LeanGauge("running", "h", ["w"], ours)
    h1 = Histogram("dur_seconds", "h", ["w"], buckets=BUCKETS, registry=theirs)
    h2 = LeanHistogram("dur_seconds", "h", ["w"], ours, buckets=BUCKETS)
    for i, v in enumerate(VALUES):
        w = "a" if i % 3 else "b"
        for c in (c1, c2):
            c.labels(w, "success").inc()
            c.labels(w, "failure").inc(0.5)
        for g in (g1, g2):
            g.labels(w).inc(2)
            g.labels(w).dec(1)
        for h in (h1, h2):
            h.labels(w).observe(v)
    assert samples(ours) == samples(theirs)
    assert generate_latest(ours).count(b"_created") == generate_latest(theirs).count(b"_created")
    # the registry knows the same names (duplicate detection, restricted scrapes)
    assert set(ours._names_to_collectors) == set(theirs._names_to_collectors)


def test_bucket_bounds_are_inclusive_and_the_last_is_inf():
    reg = CollectorRegistry()
    h = LeanHistogram("d", "h", [], reg, buckets=BUCKETS)
    for v in (0.1, 5.0, 6.0):
        h.labels().observe(v)
    got = {s.labels["le"]: s.value for s in next(iter(reg.collect())).samples if s.name == "d_bucket"}
    assert got == {"0.1": 1, "0.5": 1, "1.0": 1, "5.0": 2, "+Inf": 3}
    assert h._upper_bounds[-1] == float("inf")


def test_exemplars_are_resolved_at_scrape_and_a_bucket_keeps_its_last_one():
    resolved: list[str] = []

    def resolve(source):
        resolved.append(source)
        return {"trace_id": source} if source != "bad" else None

    reg = CollectorRegistry()
    h = LeanHistogram("d_seconds", "h", ["w"], reg, buckets=BUCKETS, resolve=resolve)
    child = h.labels("a")
    child.observe(0.05, "t1")
    child.observe(0.07)  # no exemplar: the bucket keeps t1
    child.observe(0.7, "t2")
    child.observe(3.0, "bad")  # resolves to nothing: no exemplar on that bucket
    assert resolved == []  # nothing is formatted on the observation path
    text = openmetrics_latest(reg).decode()
    [family] = [f for f in text_string_to_metric_families(text) if f.name == "d_seconds"]
    exemplars = {
        s.labels["le"]: s.exemplar for s in family.samples if s.name == "d_seconds_bucket" and s.exemplar
    }
    assert {le: (e.labels["trace_id"], e.value) for le, e in exemplars.items()} == {
        "0.1": ("t1", 0.05),
        "1.0": ("t2", 0.7),
    }
    assert sorted(resolved) == ["bad", "t1", "t2"]


def test_a_counter_refuses_to_go_down():
    c = LeanCounter("c", "h", [], CollectorRegistry())
    with pytest.raises(ValueError):
        c.labels().inc(-1)


@pytest.mark.slow  # timing-bound (threads, processes or sleeps): the full suite runs it
def test_increments_from_many_threads_are_not_lost():
    reg = CollectorRegistry()
    c, g = LeanCounter("c", "h", ["x"], reg), LeanGauge("g", "h", ["x"], reg)
    h = LeanHistogram("h", "h", ["x"], reg, buckets=BUCKETS)

    def work() -> None:
        for _ in range(20_000):
            c.labels("a").inc()
            g.labels("a").inc()
            h.labels("a").observe(0.2)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    got = {
        s.name: s.value
        for f in reg.collect()
        for s in f.samples
        if not s.name.endswith("_created") and s.labels.get("le") in (None, "+Inf")
    }
    assert got["c_total"] == got["g"] == got["h_count"] == got["h_bucket"] == 80_000
    assert got["h_sum"] == pytest.approx(80_000 * 0.2)


def test_a_name_registered_twice_is_refused_like_prometheus_client():
    reg = CollectorRegistry()
    LeanCounter("dup", "h", [], reg)
    with pytest.raises(ValueError, match="Duplicated"):
        Counter("dup", "h", registry=reg)

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


def test_each_threads_shard_adds_to_what_a_scrape_reads():
    """Per-thread shards (what the metrics plugin's node path observes into, without a
    lock) expose the same samples as the locked observations they stand for."""
    theirs, ours = pair()
    c1, c2 = Counter("runs", "h", ["w"], registry=theirs), LeanCounter("runs", "h", ["w"], ours)
    g1, g2 = Gauge("running", "h", ["w"], registry=theirs), LeanGauge("running", "h", ["w"], ours)
    h1 = Histogram("dur_seconds", "h", ["w"], buckets=BUCKETS, registry=theirs)
    h2 = LeanHistogram("dur_seconds", "h", ["w"], ours, buckets=BUCKETS)

    def work(values) -> None:
        runs, running, dur = c2.labels("a").shard(), g2.labels("a").shard(), h2.labels("a").shard()
        for v in values:
            runs.value += 1.0
            running.value += 2.0
            running.value -= 1.0
            dur.observe(v)

    values = [0.0, 0.0625, 0.125, 0.25, 0.5, 0.75, 1.0, 3.0, 5.0, 7.5, 1024.0]  # sums exact in any order
    threads = [threading.Thread(target=work, args=(values[i::3],)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    c2.labels("a").inc(2)  # the locked path beside the shards
    h2.labels("a").observe(0.25)
    for v in [*values, 0.25]:
        h1.labels("a").observe(v)
    c1.labels("a").inc(len(values) + 2)
    g1.labels("a").inc(len(values))
    assert samples(ours) == samples(theirs)
    g2.labels("a").set(4)  # a gauge set is the total, shards included
    g1.labels("a").set(4)
    assert samples(ours) == samples(theirs)


def test_a_shards_exemplar_is_kept_per_bucket_the_latest_wins():
    reg = CollectorRegistry()
    h = LeanHistogram("d_seconds", "h", [], reg, buckets=BUCKETS, resolve=lambda s: {"trace_id": s})
    child = h.labels()
    child.observe(0.05, "old")
    child.shard().observe(0.06, "new", 2e9)  # stamped later than the locked one
    child.shard().observe(0.7, "mine", 1.0)
    text = openmetrics_latest(reg).decode()
    [family] = [f for f in text_string_to_metric_families(text) if f.name == "d_seconds"]
    got = {s.labels["le"]: s.exemplar.labels["trace_id"] for s in family.samples if s.exemplar}
    assert got == {"0.1": "new", "1.0": "mine"}

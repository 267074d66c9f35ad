"""Metrics with Kafka Streams' names: sensors that keep windowed rate, average and max.

A :class:`Sensor` records values (a latency, a count); metrics registered in a
:class:`MetricsRegistry` read them as rate per second, average or maximum over
a sliding window of samples, as Kafka's metrics do (two samples of 30 s by
default). Each instance keeps one registry; the query server exports its
snapshot on ``GET /metrics`` in Prometheus' format (``query/prometheus.py``),
and ``eddyline run`` prints from it. Keeping the registry free of any exporter
lets every layer record without knowing who reads.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import NamedTuple

# Kafka's metrics.sample.window.ms and metrics.num.samples defaults.
DEFAULT_SAMPLE_SECONDS = 30.0
DEFAULT_SAMPLES = 2


class MetricName(NamedTuple):
    """A metric's identity: Kafka's (group, name, tags)."""

    group: str
    name: str
    tags: tuple[tuple[str, str], ...] = ()

    @classmethod
    def of(cls, group: str, name: str, tags: Mapping[str, str] | None = None) -> MetricName:
        return cls(group, name, tuple(sorted((tags or {}).items())))


@dataclass
class _Sample:
    start: float
    count: int = 0
    total: float = 0.0
    maximum: float = float("-inf")


@dataclass
class Sensor:
    """Records values and answers windowed statistics about them. Thread-safe."""

    sample_seconds: float = DEFAULT_SAMPLE_SECONDS
    samples: int = DEFAULT_SAMPLES
    clock: Callable[[], float] = time.monotonic
    total_count: int = 0
    # The sum of every value recorded, ever (a "-total" metric of counted things).
    total_sum: float = 0.0
    _window: list[_Sample] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def record(self, value: float = 1.0) -> None:
        now = self.clock()
        with self._lock:
            self.total_count += 1
            self.total_sum += value
            sample = self._current(now)
            sample.count += 1
            sample.total += value
            sample.maximum = max(sample.maximum, value)

    def record_many(self, count: int, total: float, maximum: float) -> None:
        """Record ``count`` values at once, given their sum and largest: what ``count``
        calls of :meth:`record` would leave (a batch's values, summed in C by the caller)."""
        if count <= 0:
            return
        now = self.clock()
        with self._lock:
            self.total_count += count
            self.total_sum += total
            sample = self._current(now)
            sample.count += count
            sample.total += total
            sample.maximum = max(sample.maximum, maximum)

    def rate(self) -> float:
        """Events per second over the window (at least one second, so a burst is not inflated)."""
        return self._per_second(lambda sample: sample.count)

    def total_rate(self) -> float:
        """Sum of recorded values per second over the window (records/s when each
        value is a batch size)."""
        return self._per_second(lambda sample: sample.total)

    def _per_second(self, amount: Callable[[_Sample], float]) -> float:
        now = self.clock()
        with self._lock:
            live = self._live(now)
            if not live:
                return 0.0
            elapsed = max(now - live[0].start, 1.0)
            return sum(amount(s) for s in live) / elapsed

    def avg(self) -> float:
        with self._lock:
            live = self._live(self.clock())
            count = sum(s.count for s in live)
            return sum(s.total for s in live) / count if count else 0.0

    def max(self) -> float:
        with self._lock:
            live = [s for s in self._live(self.clock()) if s.count]
            return max(s.maximum for s in live) if live else 0.0

    def _live(self, now: float) -> list[_Sample]:
        horizon = now - self.sample_seconds * self.samples
        self._window = [s for s in self._window if s.start > horizon]
        return self._window

    def _current(self, now: float) -> _Sample:
        if not self._window or now - self._window[-1].start >= self.sample_seconds:
            self._window.append(_Sample(start=now))
            del self._window[: -self.samples]
        return self._window[-1]


class MetricsRegistry:
    """Named metrics, each a function reading a sensor (or anything else) on demand, and
    each (group, name) with its description, as Kafka's ``Metrics.metricName(name, group,
    description, tags)`` carries one: the exporter's HELP text."""

    def __init__(self) -> None:
        self._metrics: dict[MetricName, Callable[[], float]] = {}
        self._descriptions: dict[tuple[str, str], str] = {}
        self._lock = threading.Lock()

    def register(self, name: MetricName, read: Callable[[], float], *, description: str) -> None:
        """Publish ``name``, read by ``read``. Every registration of one (group, name) must
        describe it alike: a metric means one thing whatever its tags."""
        text = " ".join(description.split())
        if not text:
            raise ValueError(f"metric {name.group}/{name.name}: give it a description (HELP)")
        with self._lock:
            known = self._descriptions.setdefault((name.group, name.name), text)
            if known != text:
                raise ValueError(
                    f"metric {name.group}/{name.name} is described twice: {known!r} and "
                    f"{text!r}; register it with one description (a module constant)"
                )
            self._metrics[name] = read

    def descriptions(self) -> dict[tuple[str, str], str]:
        """Every (group, name) ever registered, with its description."""
        with self._lock:
            return dict(self._descriptions)

    def unregister_tagged(self, tags: Mapping[str, str]) -> None:
        """Drop every metric carrying all of ``tags`` (a closed store's, say)."""
        wanted = set(tags.items())
        with self._lock:
            for name in [n for n in self._metrics if wanted <= set(n.tags)]:
                del self._metrics[name]

    def snapshot(self) -> dict[MetricName, float]:
        with self._lock:
            readers = dict(self._metrics)
        return {name: read() for name, read in readers.items()}

    def value(self, group: str, name: str, tags: Mapping[str, str] | None = None) -> float:
        """One metric's current value; KeyError names what exists when it is missing."""
        key = MetricName.of(group, name, tags)
        with self._lock:
            read = self._metrics.get(key)
            if read is None:
                known = sorted(f"{n.group}/{n.name}{dict(n.tags)}" for n in self._metrics)
                raise KeyError(f"no metric {key.group}/{key.name}{dict(key.tags)}; known: {known}")
        return read()

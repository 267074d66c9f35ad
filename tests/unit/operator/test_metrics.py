"""The operator's own metrics: the registry, its text, the endpoint, and the daemon's wiring."""

from __future__ import annotations

import asyncio
import contextvars
import re
import threading
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any

import kopf
import pytest

from eddyline_operator import handlers, metrics
from eddyline_operator.__main__ import main as operator_main
from eddyline_operator.metrics import OperatorMetrics
from tests.support.prometheus import promtool

# One sample line of the text format: name, optional labels, value.
SAMPLE = re.compile(
    r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(?:[a-zA-Z_]\w*="(?:[^"\\]|\\.)*",?)*\})? (\S+)$'
)


def samples(text: str) -> dict[str, float]:
    """``name{labels}`` -> value; every line is a comment or a well-formed sample."""
    found: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("#"):
            assert re.match(r"^# (HELP|TYPE) eddyline_operator_\w+ \S", line), line
            continue
        match = SAMPLE.match(line)
        assert match is not None, f"not a sample line: {line!r}"
        found[match.group(1) + (match.group(2) or "")] = float(match.group(3))
    return found


def test_cycles_count_per_app_and_outcome_and_durations_fill_cumulative_buckets() -> None:
    registry = OperatorMetrics(buckets=(0.1, 1.0))
    registry.record_cycle("apps", "wc", metrics.OK, 0.05)
    registry.record_cycle("apps", "wc", metrics.OK, 0.1)  # on a bound: in that bucket
    registry.record_cycle("apps", "wc", metrics.FAILED, 3.0)
    registry.record_cycle("apps", "other", metrics.PAUSED, 0.5)
    found = samples(registry.render())
    assert (
        found['eddyline_operator_reconcile_cycles_total{namespace="apps",app="wc",outcome="ok"}']
        == 2
    )
    assert (
        found[
            'eddyline_operator_reconcile_cycles_total{namespace="apps",app="wc",outcome="failed"}'
        ]
        == 1
    )
    assert (
        found[
            'eddyline_operator_reconcile_cycles_total{namespace="apps",app="other",outcome="paused"}'
        ]
        == 1
    )
    prefix = "eddyline_operator_reconcile_cycle_duration_seconds"
    bucket = prefix + '_bucket{namespace="apps",app="wc",le="%s"}'
    assert [found[bucket % le] for le in ("0.1", "1", "+Inf")] == [2, 2, 3]
    assert found[f'{prefix}_count{{namespace="apps",app="wc"}}'] == 3
    assert found[f'{prefix}_sum{{namespace="apps",app="wc"}}'] == pytest.approx(3.15)
    with pytest.raises(ValueError, match="expected one of ok, paused, failed, gone"):
        registry.record_cycle("apps", "wc", "fine", 0.1)  # fmt: skip


def test_apps_and_paused_apps_follow_the_daemons_and_the_last_cycle() -> None:
    registry = OperatorMetrics()
    text = registry.render()
    # Before any app: the families are announced, with no samples.
    assert "# TYPE eddyline_operator_apps gauge" in text
    assert not [k for k in samples(text) if k.startswith("eddyline_operator_apps")]
    registry.app_started("a", "one")
    registry.app_started("a", "two")
    registry.app_started("b", "three")
    registry.record_cycle("a", "two", metrics.PAUSED, 0.01)
    registry.record_cycle("a", "two", metrics.FAILED, 0.01)  # says nothing of the annotation
    found = samples(registry.render())
    assert found['eddyline_operator_apps{namespace="a"}'] == 2
    assert found['eddyline_operator_apps{namespace="b"}'] == 1
    assert found['eddyline_operator_apps_paused{namespace="a"}'] == 1
    assert found['eddyline_operator_apps_paused{namespace="b"}'] == 0
    registry.record_cycle("a", "two", metrics.OK, 0.01)  # the annotation was removed
    registry.app_stopped("b", "three")
    found = samples(registry.render())
    assert found['eddyline_operator_apps_paused{namespace="a"}'] == 0
    assert 'eddyline_operator_apps{namespace="b"}' not in found


def test_record_scaling_decision_counts_in_the_process_registry() -> None:
    key = 'eddyline_operator_scaling_decisions_total{namespace="apps",app="wc",direction="up"}'
    before = samples(metrics.METRICS.render()).get(key, 0.0)
    metrics.record_scaling_decision("apps", "wc", "up")
    metrics.record_scaling_decision("apps", "wc", "up")
    metrics.record_scaling_decision("apps", "wc", "down")
    after = samples(metrics.METRICS.render())
    assert after[key] == before + 2
    assert after[key.replace('"up"', '"down"')] >= 1
    with pytest.raises(ValueError, match="direction"):
        metrics.record_scaling_decision("apps", "wc", "")


def test_rollbacks_and_failed_restore_jobs_start_at_zero_with_the_app_and_outlive_it() -> None:
    """A series that first appears at 1 is no increase to Prometheus: each app's counters
    exist at 0 from its daemon's start, so the first rollback fires the alert."""
    registry = OperatorMetrics()
    text = registry.render()
    for name in (metrics.UPGRADE_ROLLBACKS, metrics.RESTORE_JOBS_FAILED):
        assert f"# TYPE {name} counter" in text and f"# HELP {name} " in text
    registry.app_started("apps", "wc")
    key = '{namespace="apps",app="wc"}'
    found = samples(registry.render())
    assert found[metrics.UPGRADE_ROLLBACKS + key] == 0
    assert found[metrics.RESTORE_JOBS_FAILED + key] == 0
    registry.record_upgrade_rollback("apps", "wc")
    registry.record_restore_job_failed("apps", "wc", 2)
    registry.app_stopped("apps", "wc")
    registry.app_started("apps", "wc")  # another replica's daemon, then this one's again
    found = samples(registry.render())
    assert found[metrics.UPGRADE_ROLLBACKS + key] == 1
    assert found[metrics.RESTORE_JOBS_FAILED + key] == 2
    with pytest.raises(ValueError, match="negative"):
        registry.record_restore_job_failed("apps", "wc", -1)


def test_label_values_are_escaped() -> None:
    registry = OperatorMetrics()
    registry.record_scaling_decision("apps", 'we"ird\\app', "up")
    text = registry.render()
    assert 'app="we\\"ird\\\\app"' in text
    samples(text)  # still well-formed


def test_family_names_are_what_a_scrape_holds() -> None:
    registry = OperatorMetrics()
    registry.app_started("apps", "wc")
    registry.record_cycle("apps", "wc", metrics.OK, 0.2)
    registry.record_scaling_decision("apps", "wc", "down")
    scraped = {key.split("{", 1)[0] for key in samples(registry.render())}
    assert scraped == set(metrics.family_names())


def get(url: str) -> tuple[int, str, str]:
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return response.status, response.headers["Content-Type"], response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, "", ""


def test_the_endpoint_serves_the_registry_and_nothing_else() -> None:
    registry = OperatorMetrics()
    registry.record_cycle("apps", "wc", metrics.OK, 0.01)
    server = metrics.serve("http://127.0.0.1:0/metrics", registry)
    try:
        status, content_type, text = get(server.url)
        assert status == 200
        assert content_type.startswith("text/plain; version=0.0.4")
        assert (
            samples(text)[
                'eddyline_operator_reconcile_cycles_total{namespace="apps",app="wc",outcome="ok"}'
            ]
            == 1
        )
        assert get(server.url.replace("/metrics", "/other"))[0] == 404
    finally:
        server.close()


def test_promtool_check_metrics_passes_on_the_operators_endpoint() -> None:
    """The real promtool lints what a scrape gets: types, HELP, the ``_total`` suffix on
    counters only, base units. Every family has samples, so each is linted with its kind."""
    registry = OperatorMetrics()
    registry.app_started("apps", "wc")
    registry.app_started("apps", "paused")
    registry.record_cycle("apps", "wc", metrics.OK, 0.01)
    registry.record_cycle("apps", "wc", metrics.FAILED, 2.0)
    registry.record_cycle("apps", "paused", metrics.PAUSED, 0.2)
    registry.record_scaling_decision("apps", "wc", "up")
    server = metrics.serve("http://127.0.0.1:0/metrics", registry)
    try:
        status, _, text = get(server.url)
    finally:
        server.close()
    assert status == 200
    families = {line.split()[2] for line in text.splitlines() if line.startswith("# TYPE")}
    assert families == set(metrics._TYPES)
    checked = promtool("check", "metrics", stdin=text)
    assert checked.returncode == 0, checked.stderr + checked.stdout


def test_promtool_check_metrics_fails_on_a_counter_without_total() -> None:
    """The check above can fail: promtool refuses what the exporter must never write."""
    checked = promtool(
        "check", "metrics", stdin="# HELP x_seconds X\n# TYPE x_seconds counter\nx_seconds 1\n"
    )
    assert checked.returncode != 0
    assert 'counter metrics should have "_total" suffix' in checked.stderr


def test_the_last_successful_cycle_is_kept_per_app_until_its_daemon_stops() -> None:
    now = [1000.0]
    registry = OperatorMetrics(clock=lambda: now[0])
    registry.app_started("apps", "wc")  # no cycle yet: the daemon's start
    name = (
        'eddyline_operator_last_successful_reconcile_timestamp_seconds{namespace="apps",app="wc"}'
    )
    assert samples(registry.render())[name] == 1000
    now[0] = 1060.0
    registry.record_cycle("apps", "wc", metrics.OK, 0.01)
    now[0] = 1120.0
    registry.record_cycle("apps", "wc", metrics.FAILED, 0.01)  # a failure leaves it
    assert samples(registry.render())[name] == 1060
    now[0] = 1180.0
    registry.record_cycle("apps", "wc", metrics.PAUSED, 0.01)  # paused: the operator works
    assert samples(registry.render())[name] == 1180
    registry.app_stopped("apps", "wc")
    assert name not in samples(registry.render())


def test_a_bad_address_or_a_taken_port_names_the_setting() -> None:
    for bad in ("0.0.0.0:9090", "https://0.0.0.0:9090/metrics", "http://host/metrics"):
        with pytest.raises(ValueError, match="EDDYLINE_OPERATOR_METRICS"):
            metrics.parse_address(bad)
    first = metrics.serve("http://127.0.0.1:0/metrics", OperatorMetrics())
    try:  # a second replica on a shared host network, say
        with pytest.raises(OSError, match=r"EDDYLINE_OPERATOR_METRICS=.*metrics\.port"):
            metrics.serve(first.url, OperatorMetrics())
    finally:
        first.close()


def test_the_operator_command_refuses_to_start_on_a_bad_metrics_address(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Before kopf runs: a typo stops the operator with the setting named, not later."""
    import kopf.cli

    started: list[Any] = []
    monkeypatch.setattr(kopf.cli, "main", lambda **kwargs: started.append(kwargs))
    monkeypatch.setenv(metrics.METRICS_ENV, "localhost:9090")
    with pytest.raises(ValueError, match="EDDYLINE_OPERATOR_METRICS"):
        operator_main([])
    assert started == []


@dataclass
class FakePlan:
    paused: bool
    recheck_seconds: float | None = None

    @property
    def status(self) -> Any:
        return type("S", (), {"phase": None})()


class OneBeat:
    """kopf's DaemonStopped as the daemon uses it: stopped after ``beats`` waits."""

    def __init__(self, beats: int) -> None:
        self.beats = beats

    def is_set(self) -> bool:
        return self.beats <= 0

    async def wait(self, delay: float) -> None:
        self.beats -= 1


def test_the_daemon_records_its_cycles_and_its_app(monkeypatch: pytest.MonkeyPatch) -> None:
    registry = OperatorMetrics()
    monkeypatch.setattr(metrics, "METRICS", registry)
    outcomes: list[Any] = [
        FakePlan(paused=False),
        FakePlan(paused=True),
        RuntimeError("boom"),
        None,
    ]
    seen_while_running: list[dict[str, float]] = []

    def run_cycle(operator: Any, namespace: str, name: str, **_: Any) -> FakePlan | None:
        seen_while_running.append(samples(registry.render()))
        outcome = outcomes.pop(0)
        if isinstance(outcome, Exception):
            raise outcome
        return outcome  # type: ignore[no-any-return]

    monkeypatch.setattr(handlers, "run_cycle", run_cycle)
    memo = kopf.Memo()
    memo[handlers.MEMO_KEY] = handlers.Operator(kube=object())  # type: ignore[arg-type]
    asyncio.run(
        handlers.follow_app(
            namespace="apps",
            name="wc",
            body=kopf.Body({}),
            stopped=OneBeat(4),
            memo=memo,  # type: ignore[arg-type]
        )
    )
    assert seen_while_running[0]['eddyline_operator_apps{namespace="apps"}'] == 1
    # After the paused cycle, and still after the failed one (it tells nothing).
    assert seen_while_running[2]['eddyline_operator_apps_paused{namespace="apps"}'] == 1
    assert seen_while_running[3]['eddyline_operator_apps_paused{namespace="apps"}'] == 1
    found = samples(registry.render())
    cycles = 'eddyline_operator_reconcile_cycles_total{namespace="apps",app="wc",outcome="%s"}'
    assert [found[cycles % o] for o in ("ok", "paused", "failed", "gone")] == [1, 1, 1, 1]
    assert (
        found['eddyline_operator_reconcile_cycle_duration_seconds_count{namespace="apps",app="wc"}']
        == 4
    )
    # The daemon ended: the app leaves the gauges.
    assert 'eddyline_operator_apps{namespace="apps"}' not in found


def test_the_daemons_cycle_runs_on_the_operators_threads_in_the_daemons_context(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """kopf keeps its settings in context variables (kopf.event reads them): a cycle run on
    the operator's executor must see the daemon's context, as asyncio.to_thread gave it."""
    monkeypatch.setattr(metrics, "METRICS", OperatorMetrics())
    kopfs = contextvars.ContextVar[str]("kopfs")
    seen: list[tuple[str | None, str]] = []

    def run_cycle(operator: Any, namespace: str, name: str, **_: Any) -> None:
        seen.append((kopfs.get(None), threading.current_thread().name))

    monkeypatch.setattr(handlers, "run_cycle", run_cycle)
    memo = kopf.Memo()
    memo[handlers.MEMO_KEY] = handlers.Operator(kube=object())  # type: ignore[arg-type]

    async def daemon() -> None:
        kopfs.set("kopf's settings")
        await handlers.follow_app(
            namespace="apps",
            name="wc",
            body=kopf.Body({}),
            stopped=OneBeat(1),
            memo=memo,  # type: ignore[arg-type]
        )

    asyncio.run(daemon())
    assert len(seen) == 1
    assert seen[0][0] == "kopf's settings"
    assert seen[0][1].startswith("eddyline-cycle")

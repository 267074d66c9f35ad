"""``eddyline-operator``'s kopf command line (issue 23, item 6): replicas elect one active
operator through kopf's peering when the chart names one; standalone otherwise."""

from __future__ import annotations

from eddyline_operator.__main__ import kopf_arguments


def test_the_charts_peering_replaces_standalone_with_a_random_priority() -> None:
    environ = {"EDDYLINE_OPERATOR_PEERING": "eddyline-operator", "WATCH_NAMESPACES": "apps"}
    first = kopf_arguments([], environ)
    assert "--standalone" not in first
    assert "--peering=eddyline-operator" in first and "--namespace=apps" in first
    priorities = {
        next(a for a in kopf_arguments([], environ) if a.startswith("--priority="))
        for _ in range(5)
    }
    assert len(priorities) > 1  # drawn anew per replica: equal priorities pause both


def test_a_priority_can_be_set() -> None:
    environ = {"EDDYLINE_OPERATOR_PEERING": "p", "EDDYLINE_OPERATOR_PRIORITY": "7"}
    assert "--priority=7" in kopf_arguments([], environ)


def test_without_a_peering_it_runs_standalone_and_arguments_win() -> None:
    assert "--standalone" in kopf_arguments([], {})
    given = kopf_arguments(["--peering=mine"], {"EDDYLINE_OPERATOR_PEERING": "p"})
    assert given.count("--peering=mine") == 1 and "--peering=p" not in given

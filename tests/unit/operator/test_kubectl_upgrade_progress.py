"""``kubectl eddyline upgrade`` following an upgrade: its step lines, and the live line
(pods ready of the app's pods) drawn with the shared renderer only when asked.

The API server is a stand-in that answers each read of the StreamApp with the next
status the operator would have written; the real control plane runs the same command
in tests/e2e/test_kubectl_plugin.py.
"""

from __future__ import annotations

import io
import re
from typing import Any, cast

import pytest

from eddyline_operator.client import Kube
from eddyline_operator.kubectl import commands
from eddyline_operator.kubectl.render import Style

APP, NAMESPACE = "wordcount", "apps"
OLD = {"ref": "wordcount:topology", "revision": "1"}
NEW = {"ref": "wordcount:topology", "revision": "2"}
STOPPING = {"step": "Stopping", "startedAt": "2026-11-28T00:00:01Z"}
STARTING = {"step": "Starting", "startedAt": "2026-11-28T00:00:05Z"}


def app(status: dict[str, Any], topology: dict[str, str]) -> dict[str, Any]:
    return {"metadata": {"name": APP}, "spec": {"topology": topology}, "status": status}


class OperatorStandIn:
    """Each ``get`` of the StreamApp returns the next recorded object, then the last."""

    def __init__(self, objects: list[dict[str, Any]]) -> None:
        self.objects = objects
        self.patches: list[dict[str, Any]] = []

    def get(self, kind: str, namespace: str, name: str) -> dict[str, Any]:
        assert (kind, namespace, name) == ("StreamApp", NAMESPACE, APP)
        return self.objects.pop(0) if len(self.objects) > 1 else self.objects[0]

    def merge_patch(self, kind: str, namespace: str, name: str, patch: dict[str, Any]) -> None:
        self.patches.append(patch)


def an_upgrade_that_succeeds() -> OperatorStandIn:
    upgrading = {"from": OLD, "to": NEW}
    return OperatorStandIn(
        [
            app({"topology": OLD, "replicas": 3, "readyReplicas": 3}, OLD),
            app(
                {
                    "topology": OLD,
                    "replicas": 3,
                    "readyReplicas": 0,
                    "upgrade": {**upgrading, "step": "Stopping", "steps": [STOPPING]},
                },
                NEW,
            ),
            app(
                {
                    "topology": OLD,
                    "replicas": 3,
                    "readyReplicas": 2,
                    "upgrade": {**upgrading, "step": "Starting", "steps": [STOPPING, STARTING]},
                },
                NEW,
            ),
            app(
                {
                    "topology": NEW,
                    "replicas": 3,
                    "readyReplicas": 3,
                    "lastUpgrade": {
                        **upgrading,
                        "outcome": "Succeeded",
                        "steps": [STOPPING, STARTING],
                        "finishedAt": "2026-11-28T00:00:09Z",
                    },
                },
                NEW,
            ),
        ]
    )


def follow(operator: OperatorStandIn, *, progress: bool) -> str:
    out = io.StringIO()
    ran = commands.upgrade(
        cast(Kube, operator),
        NAMESPACE,
        APP,
        ref="wordcount:topology",
        revision=None,
        wait_seconds=60,
        out=out,
        style=Style(colour=False, width=None),
        progress=progress,
    )
    assert ran
    assert operator.patches == [{"spec": {"topology": NEW}}]
    return out.getvalue()


@pytest.fixture(autouse=True)
def no_waiting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(commands.time, "sleep", lambda seconds: None)


def test_with_progress_each_step_gets_a_live_line_of_pods_ready_erased_before_the_next() -> None:
    shown = follow(an_upgrade_that_succeeds(), progress=True)
    # The elapsed seconds are the real clock's; the renderer's own tests pin them.
    shown = re.sub(r", \d+ s", ", N s", shown)
    assert shown == (
        "wordcount: upgrading from wordcount:topology@1 to wordcount:topology@2\n"
        "    2026-11-28T00:00:01Z  Stopping\n"
        "\r\x1b[K  Stopping: 0 of 3 pods ready (0%), N s"
        "\r\x1b[K"
        "    2026-11-28T00:00:05Z  Starting\n"
        "\r\x1b[K  Starting: 2 of 3 pods ready (67%), N s"
        "\r\x1b[K"
        "wordcount: wordcount:topology@2 runs\n"
    )


def test_without_progress_only_whole_lines_are_written() -> None:
    shown = follow(an_upgrade_that_succeeds(), progress=False)
    assert shown == (
        "wordcount: upgrading from wordcount:topology@1 to wordcount:topology@2\n"
        "    2026-11-28T00:00:01Z  Stopping\n"
        "    2026-11-28T00:00:05Z  Starting\n"
        "wordcount: wordcount:topology@2 runs\n"
    )

"""Many StreamApps on one operator (issue 23, item 1) on the real control plane, shared by
``tests/e2e/test_operator_many_apps.py`` (asserts) and ``tests/bench/bench_operator.py``
(measures).

``apps - 1`` suspended copies of the word count (each still holds a daemon, which is what
exhausted kopf's thread pool when daemons were sync) and the word count itself with 3 pods.
The operator's beat is long (``BEAT_SECONDS``), so only a pod event can republish the last
app's membership after one of its pods is SIGKILLed.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from eddyline_runtime.log import open_log
from tests.support.control_plane.client import wait_until
from tests.support.control_plane.operator import REPO, Operator

MANIFEST = REPO / "examples" / "wordcount" / "streamapp.cluster.yaml"
LAST = "wordcount"
# Long enough that the daemon's own beat cannot be what republishes a membership.
BEAT_SECONDS = 60
OPERATOR_ENV = {"EDDYLINE_OPERATOR_RESYNC_SECONDS": str(BEAT_SECONDS)}


def manifests(apps: int) -> list[dict[str, Any]]:
    """``apps - 1`` suspended copies of the word count, then the word count itself."""
    base: dict[str, Any] = yaml.safe_load(MANIFEST.read_text(encoding="utf-8"))
    documents = []
    for index in range(apps - 1):
        copy = json.loads(json.dumps(base))
        copy["metadata"]["name"] = f"idle-{index:02d}"
        copy["spec"]["suspend"] = True
        documents.append(copy)
    documents.append(base)
    return documents


def phase(harness: Operator, name: str) -> str | None:
    value = (harness.app(name).get("status") or {}).get("phase")
    return None if value is None else str(value)


def reconciled(harness: Operator, names: list[str]) -> list[str]:
    """The apps in their expected phase: Suspended, and Running for the last."""
    return [
        name
        for name in names
        if phase(harness, name) == ("Running" if name == LAST else "Suspended")
    ]


def membership(harness: Operator, app: str) -> dict[str, Any] | None:
    found = harness.get("", "configmaps", f"{app}-membership")
    if found is None:
        return None
    document: dict[str, Any] = json.loads(found["data"]["membership.json"])
    return document


@dataclass
class ManyApps:
    """A run: the apps applied, then the last app's pod killed."""

    harness: Operator
    names: list[str]

    @classmethod
    def apply(cls, harness: Operator, apps: int, work: Path) -> ManyApps:
        assert harness.cluster.provisioner is not None
        claim = harness.cluster.provisioner.directory(harness.namespace, f"{LAST}-log")
        claim.mkdir(parents=True, exist_ok=True)
        log = open_log(f"sqlite:///{claim}/log.db")  # the input topic exists before the app
        log.create_topic("text-lines", 4)
        log.close()
        harness.wait_watching()
        documents = manifests(apps)
        path = work / "apps.yaml"
        path.write_text(yaml.safe_dump_all(documents), encoding="utf-8")
        harness.kubectl("apply", "-f", str(path))
        return cls(harness, [d["metadata"]["name"] for d in documents])

    def wait_reconciled(self, timeout: float) -> None:
        try:
            wait_until(
                lambda: len(reconciled(self.harness, self.names)) == len(self.names),
                f"{len(self.names) - 1} apps Suspended and {LAST} Running",
                timeout,
            )
        except TimeoutError:
            done = set(reconciled(self.harness, self.names))
            print(f"not reconciled: {[n for n in self.names if n not in done]}")
            print(self.harness.describe_failure(LAST))
            raise

    def kill_last_member(self, timeout: float) -> tuple[str, float]:
        """SIGKILL a member of the last app; (its name, seconds until it left the membership)."""
        before = membership(self.harness, LAST)
        assert before is not None
        victim = sorted(before["assignment"]["active"])[0]
        killed = time.monotonic()
        kubelets = self.harness.cluster.kubelets
        assert kubelets is not None
        kubelets.kill_container(self.harness.namespace, victim)
        while True:  # polled finely: the time is what the benchmark reports
            now = membership(self.harness, LAST)
            if now is not None and victim not in now["assignment"]["active"]:
                return victim, time.monotonic() - killed
            if time.monotonic() - killed > timeout:
                print(self.harness.describe_failure(LAST))
                raise TimeoutError(f"{victim} still in {LAST}'s membership after {timeout} s")
            time.sleep(0.01)

    def delete_all(self, timeout: float) -> None:
        self.harness.kubectl("delete", "sapp", "--all", "--wait=false")
        wait_until(
            lambda: not self.harness.objects("eddyline.dev/v1alpha1", "streamapps"),
            f"all {len(self.names)} StreamApps deleted (finalizers removed)",
            timeout,
        )

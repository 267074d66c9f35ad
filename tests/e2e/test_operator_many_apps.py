"""Many StreamApps on one operator (issue 23, item 1): the number of apps is bounded by
memory, not by kopf's worker threads.

A sync ``kopf.daemon`` per app held one of kopf's threads for the app's whole life
(``min(32, cpus + 4)``: 6 on 2 CPUs), so the 7th app was never reconciled, could not be
deleted, and pod events stopped being handled for every app. Here 50 apps run on the
emulated cluster: 49 suspended (each still has its daemon), the last with 3 pods. The beat
is 60 s, so only a pod event can republish the last app's membership after its pod is
SIGKILLed: it must leave the membership within 10 s. Then every app deletes.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from eddyline_runtime.log import open_log
from tests.support.k8s.kubectl import KUBECTL
from tests.support.k8s.operator_harness import REPO, OperatorHarness
from tests.support.waiting import wait_for

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(KUBECTL is None, reason="kubectl is not on PATH"),
]

MANIFEST = REPO / "examples" / "wordcount" / "streamapp.cluster.yaml"
APPS = 50
LAST = "wordcount"
# Long enough that the daemon's own beat cannot be what republishes within the 10 s.
BEAT_SECONDS = 60


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


def phase(harness: OperatorHarness, name: str) -> str | None:
    status = harness.app(name).get("status") or {}
    value = status.get("phase")
    return None if value is None else str(value)


def membership(harness: OperatorHarness, app: str) -> dict[str, Any] | None:
    found = harness.get("", "configmaps", f"{app}-membership")
    if found is None:
        return None
    document: dict[str, Any] = json.loads(found["data"]["membership.json"])
    return document


@pytest.fixture(scope="module")
def harness(tmp_path_factory: pytest.TempPathFactory) -> Iterator[OperatorHarness]:
    pytest.importorskip("helm_sdkpy")
    running = OperatorHarness(
        tmp_path_factory.mktemp("many-apps"),
        examples=["wordcount"],
        extra_env={"EDDYLINE_OPERATOR_RESYNC_SECONDS": str(BEAT_SECONDS)},
    )
    running.start()
    yield running
    running.stop()


@pytest.mark.timeout(600)
def test_fifty_apps_reconcile_fail_over_on_pod_events_and_delete(
    harness: OperatorHarness, tmp_path: Any
) -> None:
    claim = harness.claim_dir(f"{LAST}-log")
    claim.mkdir(parents=True)
    log = open_log(f"sqlite:///{claim}/log.db")
    log.create_topic("text-lines", 4)
    log.close()
    harness.wait_until_operator_watches()
    assert harness.kubectl is not None
    documents = manifests(APPS)
    path = tmp_path / "apps.yaml"
    path.write_text(yaml.safe_dump_all(documents), encoding="utf-8")
    harness.kubectl("apply", "-f", str(path))
    names = [d["metadata"]["name"] for d in documents]

    def all_reconciled() -> bool:
        phases = [phase(harness, n) for n in names[:-1]]
        return all(p == "Suspended" for p in phases) and phase(harness, LAST) == "Running"

    try:
        wait_for(all_reconciled, f"{APPS - 1} apps Suspended and {LAST} Running", 300)
    except AssertionError:
        missing = [n for n in names if phase(harness, n) not in ("Suspended", "Running")]
        print(f"not reconciled: {missing}")
        print(harness.describe_failure(LAST))
        raise

    # SIGKILL a member of the last app: only its pod event can republish within 10 s.
    before = membership(harness, LAST)
    assert before is not None
    victim = sorted(before["assignment"]["active"])[0]
    killed = time.monotonic()
    harness.cluster.kill_container(harness.namespace, victim)

    def left() -> bool:
        now = membership(harness, LAST)
        return now is not None and victim not in now["assignment"]["active"]

    try:
        wait_for(left, f"{victim} out of {LAST}'s membership", 10)
    except AssertionError:
        print(harness.describe_failure(LAST))
        raise
    print(f"kill -> membership without {victim}: {time.monotonic() - killed:.2f} s")

    harness.kubectl("delete", "sapp", "--all", "--wait=false")

    def all_gone() -> bool:
        return not harness.objects("eddyline.dev", "streamapps")

    wait_for(all_gone, f"all {APPS} StreamApps deleted (finalizers removed)", 180)

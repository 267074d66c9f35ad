"""Topology upgrade benchmark (issue 11), run by ``make bench-operator`` after its own part.

A full-cluster upgrade of word count to a topology that gains a first sub-topology (every
ordinal shifts), with 3 replicas and ``--upgrade-keys`` keys in the ``word-counts`` store
(100,000 by default), side by side with the same kind of upgrade after the pods' state
directories were emptied before the new revision starts: what Kafka Streams users do today
(the application reset tool, then every store rebuilt from its changelog). Measured from
outside, polling the StreamApp's status every 10 ms:

* ``upgrade_stop_s``: ``kubectl apply`` until status says Publishing (every old pod gone:
  SIGTERM, final commit, exit);
* ``upgrade_publish_s``: Publishing until Starting (ConfigMap, template, membership reset);
* ``upgrade_start_s``: Starting until the upgrade is done (every pod Ready and assigned, no
  store restoring); ``upgrade_relocate_s`` is the part of it the pods spent relocating
  state directories (the largest ``state-relocation-seconds`` a pod reports; they start
  in parallel);
* ``upgrade_total_s``: apply until done; ``upgrade_restored_records``: records the pods
  restored from changelogs (their ``restore-total`` metrics; the target is 0);
* ``*_restore_s``: the longest a store partition spent restoring (records / rate);
* ``rebuild_*``: the same for the reverse upgrade with every state claim emptied at the
  moment the operator records Publishing (no pod exists then; a watch of the StreamApp
  sees the step, the operator is frozen with SIGSTOP for the wipe and continued after it,
  and the wipe's own time is subtracted), so every store restores from its changelog.

It runs on the real control plane (``tests/support/control_plane``): the real StatefulSet
controller rolls the pods, the kubelet stand-in runs them.
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import threading
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal, overload

import yaml

from eddyline_runtime.log import Record, open_log
from eddyline_runtime.partitions import TopicPartition
from eddyline_runtime.query.client import QueryFailedError, QueryRouter
from tests.support.control_plane.client import Informer, wait_until
from tests.support.control_plane.operator import Operator

APP = "wordcount"
STORE = "word-counts"
WORDS_PER_LINE = 10


class UpgradeBench:
    def __init__(self, harness: Operator, log_url: str, service: str, manifest: Path):
        self.harness = harness
        self.log_url = log_url
        self.service = service
        self.manifest = manifest
        self.keys: list[str] = []

    def fill(self, keys: int) -> None:
        """``keys`` distinct words, each once, then wait until a sample is counted."""
        self.keys = [f"k{index:07d}" for index in range(keys)]
        lines = [
            " ".join(self.keys[i : i + WORDS_PER_LINE]) for i in range(0, keys, WORDS_PER_LINE)
        ]
        log = open_log(self.log_url)
        try:
            now = int(time.time() * 1000)
            for partition in range(4):
                part = lines[partition::4]
                for start in range(0, len(part), 2_000):
                    records = [
                        Record(None, line.encode(), now) for line in part[start : start + 2_000]
                    ]
                    log.produce(TopicPartition("text-lines", partition), records)
        finally:
            log.close()
        sample = random.Random(11).sample(self.keys, min(300, keys)) + self.keys[-40:]
        wait_until(lambda: self._counted(sample), f"{keys} keys counted", 600)

    def _counted(self, sample: list[str]) -> bool:
        router = QueryRouter([self.service], timeout=2)
        for key in sample:
            try:
                result = router.get(STORE, key)
            except QueryFailedError:
                return False
            if not result.found or int(result.value) < 1:
                return False
        return True

    def upgrade(
        self, tmp: Path, ref: str, revision: str, *, wipe: bool = False
    ) -> dict[str, float]:
        """One upgrade, timed by its steps as status shows them."""
        harness = self.harness
        wiped = [0.0]
        done = threading.Event()

        def empty_claims() -> None:
            if not wipe or done.is_set():
                return
            for obj in informer.items():
                upgrade = (obj.get("status") or {}).get("upgrade") or {}
                if upgrade.get("step") != "Publishing" or harness.process is None:
                    continue
                # Frozen while the claims are emptied: nothing can start a pod meanwhile.
                os.kill(harness.process.pid, signal.SIGSTOP)
                started = time.monotonic()
                try:
                    assert harness.cluster.provisioner is not None
                    for ordinal in range(3):
                        claim = harness.cluster.provisioner.directory(
                            harness.namespace, f"state-{APP}-{ordinal}"
                        )
                        for child in claim.iterdir():
                            if child.is_dir():
                                shutil.rmtree(child)
                            else:
                                child.unlink()
                finally:
                    wiped[0] = max(time.monotonic() - started, 1e-9)
                    os.kill(harness.process.pid, signal.SIGCONT)
                    done.set()

        informer = Informer(
            harness.admin, harness.path("eddyline.dev/v1alpha1", "streamapps"),
            on_change=empty_claims,
        )  # fmt: skip
        informer.start()
        try:
            wait_until(informer.synced.is_set, "the StreamApp watch", 30)
            document: dict[str, Any] = yaml.safe_load(self.manifest.read_text(encoding="utf-8"))
            document["spec"]["topology"] = {"ref": ref, "revision": revision}
            path = tmp / f"upgrade-{revision}.yaml"
            path.write_text(yaml.safe_dump(document), encoding="utf-8")
            applied = time.monotonic()
            harness.kubectl("apply", "-f", str(path))
            marks = self._follow(applied, revision)
        finally:
            informer.stop()
        # The operator was frozen for the wipe after it recorded Publishing, delaying
        # Starting: the wipe's time is taken off publish_s and total_s.
        return {
            "stop_s": marks["publishing"] - applied,
            "publish_s": marks["starting"] - marks["publishing"] - wiped[0],
            "start_s": marks["done"] - marks["starting"],
            "total_s": marks["done"] - applied - wiped[0],
            "relocate_s": self._relocation_seconds(),
            "restore_s": self._restore_seconds(),
            "restored_records": float(self._restored()),
        }

    def _follow(self, applied: float, revision: str) -> dict[str, float]:
        marks: dict[str, float] = {}
        deadline = applied + 900
        while "done" not in marks:
            if time.monotonic() > deadline:
                raise RuntimeError(self.harness.describe_failure(APP)[-6000:])
            status = self.harness.app(APP).get("status", {})
            now = time.monotonic()
            step = (status.get("upgrade") or {}).get("step")
            if step == "Publishing":
                marks.setdefault("publishing", now)
            elif step == "Starting":
                marks.setdefault("publishing", now)
                marks.setdefault("starting", now)
            last = status.get("lastUpgrade") or {}
            if step is None and (last.get("to") or {}).get("revision") == revision:
                if last.get("outcome") != "Succeeded":
                    raise RuntimeError(f"the upgrade to {revision} ended {last}")
                marks.setdefault("publishing", now)
                marks.setdefault("starting", now)
                marks["done"] = now
            time.sleep(0.01)
        return marks

    def _relocation_seconds(self) -> float:
        """The longest relocation a pod reports (``state-relocation-seconds``; the pods start
        in parallel)."""
        return max(self._metric("eddyline_stream_metrics_state_relocation_seconds"), default=0.0)

    def _restore_seconds(self) -> float:
        """The longest a store partition spent restoring (its records / its rate)."""
        totals = self._metric("eddyline_stream_state_metrics_restore_total", by_sample=True)
        rates = self._metric("eddyline_stream_state_metrics_restore_rate", by_sample=True)
        return max(
            (records / rates[key] for key, records in totals.items() if rates.get(key)),
            default=0.0,
        )

    def _restored(self) -> int:
        return int(sum(self._metric("eddyline_stream_state_metrics_restore_total")))

    @overload
    def _metric(self, family: str) -> list[float]: ...
    @overload
    def _metric(self, family: str, *, by_sample: Literal[True]) -> dict[str, float]: ...
    def _metric(self, family: str, *, by_sample: bool = False) -> Any:
        """A metric family's samples over the app's pods (by pod and labels if asked)."""
        samples: dict[str, float] = {}
        for name, pod in self.harness.pods(APP).items():
            ip = pod.get("status", {}).get("podIP")
            with urllib.request.urlopen(f"http://{ip}:7070/metrics", timeout=5) as response:
                for line in response.read().decode().splitlines():
                    if line.startswith(family + "{") or line.startswith(family + " "):
                        labels, value = line.rsplit(" ", 1)
                        samples[name + labels.removeprefix(family)] = float(value)
        return samples if by_sample else list(samples.values())


def run(
    harness: Operator,
    log_url: str,
    service: str,
    manifest: Path,
    *,
    keys: int,
    rebuild_first: bool = False,
    report: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Both upgrades; the JSON keys the issue asks for. ``rebuild_first``: the reset and
    rebuild runs first (the first upgrade's stop also writes out what the fill left in
    memory, so the order is part of what a comparison of stop steps sees)."""
    bench = UpgradeBench(harness, log_url, service, manifest)
    filled = time.monotonic()
    bench.fill(keys)
    report(f"{keys} keys in {STORE}: counted in {time.monotonic() - filled:.1f} s")
    tmp = harness.root
    if rebuild_first:
        rebuilt = bench.upgrade(tmp, "wordcount:topology_v2", "2", wipe=True)
        relocated = bench.upgrade(tmp, "wordcount:topology", "3")
    else:
        relocated = bench.upgrade(tmp, "wordcount:topology_v2", "2")
        rebuilt = bench.upgrade(tmp, "wordcount:topology", "3", wipe=True)
    report("upgrade (relocate): " + ", ".join(f"{k} {v:.3f}" for k, v in relocated.items()))
    report("upgrade (reset + rebuild): " + ", ".join(f"{k} {v:.3f}" for k, v in rebuilt.items()))
    summary: dict[str, Any] = {"upgrade_keys": keys, "upgrade_rebuild_first": rebuild_first}
    for key, value in relocated.items():
        summary[f"upgrade_{key}"] = round(value, 3)
    for key, value in rebuilt.items():
        summary[f"rebuild_{key}"] = round(value, 3)
    summary["upgrade_restored_records"] = int(relocated["restored_records"])
    summary["rebuild_restored_records"] = int(rebuilt["restored_records"])
    return summary

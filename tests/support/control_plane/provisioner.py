"""A local-directory volume provisioner, as local-path provisioners do.

The StorageClass ``local-dir`` (the default, ``WaitForFirstConsumer``) names this provisioner.
The real PV controller marks each claim of that class for it, the real scheduler picks the
node (``volume.kubernetes.io/selected-node``); this creates a ``local`` PersistentVolume on a
directory for that node (``<root>/<namespace>/<claim>``, a path tests can know in advance),
and the PV controller binds the two. A released volume whose policy is Delete is removed with
its directory.

With ``shared_across_nodes`` (the real-node tier), a ``ReadWriteMany`` claim (a restore
build's, which executors on several nodes write and pods on every node read) gets a volume
every node may mount: its node affinity names any node. That stands in for a shared file
system (NFS, CephFS, a cloud's file store): it works only because the real nodes are
kubelets on one host, so a directory of that host is the same directory on every node.
"""

from __future__ import annotations

import shutil
import sys
import threading
from pathlib import Path

from tests.support.control_plane.client import ApiError, Client, Informer
from tests.support.control_plane.pods import Obj

NAME = "eddyline.dev/local-dir"
STORAGE_CLASS = "local-dir"
PROVISIONER_ANNOTATION = "volume.kubernetes.io/storage-provisioner"
SELECTED_NODE = "volume.kubernetes.io/selected-node"
PROVISIONED_BY = "pv.kubernetes.io/provisioned-by"


class LocalProvisioner:
    def __init__(self, client: Client, root: Path, *, shared_across_nodes: bool = False) -> None:
        self.client = client
        self.root = root
        self.shared_across_nodes = shared_across_nodes
        self._wake = threading.Event()
        self._stop = threading.Event()
        self.claims = Informer(client, "/api/v1/persistentvolumeclaims", on_change=self._wake.set)
        self.volumes = Informer(client, "/api/v1/persistentvolumes", on_change=self._wake.set)
        self._thread = threading.Thread(target=self._run, name="provisioner", daemon=True)

    def start(self) -> LocalProvisioner:
        self.root.mkdir(parents=True, exist_ok=True)
        self.client.ensure(
            "/apis/storage.k8s.io/v1/storageclasses",
            {
                "metadata": {
                    "name": STORAGE_CLASS,
                    "annotations": {"storageclass.kubernetes.io/is-default-class": "true"},
                },
                "provisioner": NAME,
                "reclaimPolicy": "Delete",
                "volumeBindingMode": "WaitForFirstConsumer",
            },
        )
        self.claims.start()
        self.volumes.start()
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        self.claims.stop()
        self.volumes.stop()

    def directory(self, namespace: str, claim: str) -> Path:
        return self.root / namespace / claim

    def _run(self) -> None:
        while not self._stop.is_set():
            self._wake.clear()
            try:
                for claim in self.claims.items():
                    self._provision(claim)
                for volume in self.volumes.items():
                    self._reclaim(volume)
            except Exception as error:  # keep going; a test sees the claim stay Pending
                print(f"provisioner: {type(error).__name__}: {error}", file=sys.stderr)
            self._wake.wait(1.0)

    def _provision(self, claim: Obj) -> None:
        meta, spec = claim["metadata"], claim["spec"]
        annotations = meta.get("annotations", {})
        if annotations.get(PROVISIONER_ANNOTATION) != NAME or spec.get("volumeName"):
            return
        node = annotations.get(SELECTED_NODE)
        if node is None or meta.get("deletionTimestamp"):
            return  # WaitForFirstConsumer: the scheduler has not picked a node yet
        namespace, name = meta["namespace"], meta["name"]
        directory = self.directory(namespace, name)
        directory.mkdir(parents=True, exist_ok=True)
        nodes: Obj = {"key": "kubernetes.io/hostname", "operator": "In", "values": [node]}
        if self.shared_across_nodes and "ReadWriteMany" in spec.get("accessModes", []):
            nodes = {"key": "kubernetes.io/hostname", "operator": "Exists"}
        volume = {
            "metadata": {"name": f"pvc-{meta['uid']}", "annotations": {PROVISIONED_BY: NAME}},
            "spec": {
                "capacity": {"storage": spec["resources"]["requests"]["storage"]},
                "accessModes": spec.get("accessModes", ["ReadWriteOnce"]),
                "persistentVolumeReclaimPolicy": "Delete",
                "storageClassName": spec.get("storageClassName", STORAGE_CLASS),
                "volumeMode": spec.get("volumeMode", "Filesystem"),
                "claimRef": {
                    "apiVersion": "v1",
                    "kind": "PersistentVolumeClaim",
                    "namespace": namespace,
                    "name": name,
                    "uid": meta["uid"],
                },
                "local": {"path": str(directory)},
                "nodeAffinity": {
                    "required": {"nodeSelectorTerms": [{"matchExpressions": [nodes]}]}
                },
            },
        }
        try:
            self.client.create("/api/v1/persistentvolumes", volume)
        except ApiError as error:
            if error.code != 409:
                raise

    def _reclaim(self, volume: Obj) -> None:
        meta, spec = volume["metadata"], volume["spec"]
        if meta.get("annotations", {}).get(PROVISIONED_BY) != NAME:
            return
        if volume.get("status", {}).get("phase") != "Released":
            return
        if spec.get("persistentVolumeReclaimPolicy") != "Delete":
            return
        path = Path(spec.get("local", {}).get("path", ""))
        if path.is_relative_to(self.root):
            shutil.rmtree(path, ignore_errors=True)
        self.client.delete(f"/api/v1/persistentvolumes/{meta['name']}")

"""The cluster-wide lists every app's cycle reads: Nodes (zones, readiness) and node Leases
(whether a node is alive). One list serves every app: a big cluster's Node list is too
heavy for every cycle of every app, and a node's zone label does not change.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from eddyline_operator.client import ApiError, Kube

logger = logging.getLogger(__name__)

# Nodes are listed again at least this often (readiness for the log's pin, new labels).
NODES_SECONDS = 10.0
# Node Leases (kube-node-lease) are listed again at least this often: a dead node is
# noticed within its grace plus this long.
LEASES_SECONDS = 2.0
# The namespace where each kubelet renews its node's Lease.
NODE_LEASE_NAMESPACE = "kube-node-lease"


class ClusterView:
    """Nodes and node Leases as last listed, each with the ``time.monotonic()`` of its list."""

    def __init__(self) -> None:
        self._nodes: tuple[float, list[Any]] = (float("-inf"), [])
        self._nodes_lock = threading.Lock()
        self._leases: tuple[float, list[Any]] = (float("-inf"), [])
        self._leases_lock = threading.Lock()

    def nodes(self, kube: Kube, wanted: set[Any]) -> list[Any]:
        """The cluster's Nodes, listed again only when a pod runs on one not seen yet, or
        every NODES_SECONDS."""
        with self._nodes_lock:
            listed_at, nodes = self._nodes
            known = {n.get("metadata", {}).get("name") for n in nodes}
            if time.monotonic() - listed_at < NODES_SECONDS and wanted <= known:
                return nodes
            nodes = _listed(
                kube,
                "Node",
                None,
                "cannot list Nodes (RBAC): zones unknown; grant nodes get/list/watch",
            )
            self._nodes = (time.monotonic(), nodes)
            return nodes

    def leases(self, kube: Kube) -> list[Any]:
        """The node Leases in kube-node-lease, listed again every LEASES_SECONDS: their
        renewals are how a dead node is told from a quiet one."""
        with self._leases_lock:
            listed_at, leases = self._leases
            if time.monotonic() - listed_at < LEASES_SECONDS:
                return leases
            leases = _listed(
                kube,
                "Lease",
                NODE_LEASE_NAMESPACE,
                f"cannot list Leases in {NODE_LEASE_NAMESPACE} (RBAC): a lost node is noticed "
                "only from its Ready condition; grant coordination.k8s.io leases get/list/watch",
            )
            self._leases = (time.monotonic(), leases)
            return leases


def _listed(kube: Kube, kind: str, namespace: str | None, refused: str) -> list[Any]:
    """Every ``kind`` (in ``namespace``); none, with the warning ``refused``, when RBAC
    forbids the list: the cycle goes on with less to go by."""
    try:
        return kube.list(kind, namespace)
    except ApiError as error:
        if error.status != 403:
            raise
        logger.warning("%s", refused)
        return []

"""A real Kubernetes control plane for tests, started by the project's own files.

``scripts/build-control-plane`` builds kube-apiserver, kube-controller-manager,
kube-scheduler and etcd from pinned Go modules (``tools/``); :class:`Cluster` starts them on
loopback, then the stand-ins for what a real cluster runs on its machines: three kubelets
(:mod:`.kubelet`), a local-directory volume provisioner (:mod:`.provisioner`) and a Service
proxy (:mod:`.proxy`). Tests request the session-scoped ``control_plane`` fixture
(:mod:`.fixture`); ``make cluster`` starts the same for a person.
"""

from tests.support.control_plane.cluster import Cluster

__all__ = ["Cluster"]

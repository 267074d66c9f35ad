"""Real nodes for tests: kubelets on containerd, runc and CNI, on this host (opt-in).

The default suite runs pods on the kubelet stand-in (``tests/support/control_plane``); the
``realnode`` tier asks for the ``real_cluster`` fixture (:mod:`.fixture`) instead, which starts
:class:`~.cluster.RealCluster`: the real control plane on a bridge address (:mod:`.cluster`),
and per zone a node (:mod:`.node`) with its own containerd, kubelet, cgroup root and pod
subnet, running images built here (:mod:`.images`), and one kube-proxy for the Services of
all of them (:mod:`.kube_proxy`). :mod:`.host` owns what the nodes make on
the machine and removes it again, after a crash too. ``docs/nodes.md`` describes the design.
"""

from tests.support.realnode.cluster import RealCluster

__all__ = ["RealCluster"]

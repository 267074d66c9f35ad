"""``make real-cluster``: the real-node cluster for a person, until Ctrl-C.

.venv/bin/python -m tests.support.realnode   (as root; from the repository, as the Makefile runs it)
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

from tests.support.realnode.cluster import RealCluster
from tests.support.signals import wait_for_stop_signal


def main() -> None:
    cluster = RealCluster(Path(tempfile.mkdtemp(prefix="eddyline-real-cluster-"))).start()
    timings = {step: round(seconds, 1) for step, seconds in cluster.timings.items()}
    images = "\n".join(f"  {image.reference}" for image in cluster.images)
    print(
        f"""real nodes ready (API {cluster.plane.url}); seconds per step:
{json.dumps(timings)}

  export KUBECONFIG={cluster.plane.admin_kubeconfig}
  kubectl get nodes -L topology.kubernetes.io/zone
  # images every node holds (imagePullPolicy: Never):
{images}
  # a node's containers:
  ctr --address {next(iter(cluster.nodes.values())).socket} -n k8s.io containers ls

Component logs under {cluster.plane.logs} and /var/lib/eddyline-realnode/<node>/logs.
Ctrl-C stops everything and cleans the host (docs/nodes.md).""",
        flush=True,
    )
    try:
        wait_for_stop_signal()
    finally:
        cluster.stop()


if __name__ == "__main__":
    main()

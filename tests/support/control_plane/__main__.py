"""``make cluster``: the tests' control plane for a person, until Ctrl-C.

.venv/bin/python -m tests.support.control_plane   (from tests/, as the Makefile runs it)
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from tests.support.control_plane.cluster import Cluster
from tests.support.signals import wait_for_stop_signal

REPO = Path(__file__).resolve().parents[3]


def main() -> None:
    root = Path(tempfile.mkdtemp(prefix="eddyline-cluster-"))
    examples = sorted(str(p) for p in (REPO / "examples").iterdir() if p.is_dir())
    cluster = Cluster(root, pythonpath=examples).start()
    assert cluster.provisioner is not None
    print(
        f"""control plane ready in {cluster.startup_seconds:.0f} s (API {cluster.plane.url})

  export KUBECONFIG={cluster.kubeconfig}
  kubectl get nodes
  # the chart, as docs/operator.md describes:
  helm install eddyline charts/eddyline-operator      # or the operator locally:
  #   eddyline-operator with the same KUBECONFIG
  kubectl apply -f examples/wordcount/streamapp.cluster.yaml

Claims live under {cluster.provisioner.root}/<namespace>/<claim>; component logs under
{cluster.plane.logs}. Ctrl-C stops everything.""",
        flush=True,
    )
    try:
        wait_for_stop_signal()
    finally:
        cluster.stop()


if __name__ == "__main__":
    main()

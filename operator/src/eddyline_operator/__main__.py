"""``eddyline-operator``: run the operator under kopf with eddyline's defaults.

``kopf run -m eddyline_operator`` plus a liveness endpoint, the namespaces to watch and the
peering, from the environment the Helm chart sets: ``WATCH_NAMESPACES`` (comma-separated;
empty = every namespace), ``EDDYLINE_OPERATOR_LIVENESS`` (default
``http://0.0.0.0:8080/healthz``) and ``EDDYLINE_OPERATOR_PEERING``: the name of the kopf
peering (``KopfPeering`` per watched namespace, ``ClusterKopfPeering`` cluster-wide) in which
replicas elect one active operator. Each replica takes a random priority
(``EDDYLINE_OPERATOR_PRIORITY`` sets it): kopf pauses every replica but the one of the
highest priority, and one of equal priority would pause both. Without a peering name it
runs ``--standalone`` (one replica, as a local run). Extra arguments go to ``kopf run``
unchanged. ``EDDYLINE_OPERATOR_METRICS`` (e.g. ``http://0.0.0.0:9090/metrics``; unset: none)
is where the operator's own Prometheus metrics are served (``eddyline_operator.metrics``).
``EDDYLINE_OPERATOR_PROFILE`` (a file; unset: none) profiles it (``eddyline_operator.profiling``).
"""

from __future__ import annotations

import os
import random
import sys
from collections.abc import Sequence

DEFAULT_LIVENESS = "http://0.0.0.0:8080/healthz"
PEERING_ENV = "EDDYLINE_OPERATOR_PEERING"
PRIORITY_ENV = "EDDYLINE_OPERATOR_PRIORITY"
# Random priorities are drawn from this range: two replicas tie with odds of one in 2**31.
_PRIORITIES = (1, 2**31 - 1)


def kopf_arguments(argv: Sequence[str], environ: dict[str, str]) -> list[str]:
    """The ``kopf run`` command line for these arguments and environment."""
    namespaces = [n.strip() for n in environ.get("WATCH_NAMESPACES", "").split(",") if n.strip()]
    scope = [f"--namespace={n}" for n in namespaces] or ["--all-namespaces"]
    if any(a.startswith(("--namespace", "-n", "--all-namespaces", "-A")) for a in argv):
        scope = []
    liveness = environ.get("EDDYLINE_OPERATOR_LIVENESS", DEFAULT_LIVENESS)
    peering = environ.get(PEERING_ENV, "").strip()
    mode = ["--standalone"]
    if peering:
        priority = environ.get(PRIORITY_ENV, "").strip() or str(random.randint(*_PRIORITIES))
        mode = [f"--peering={peering}", f"--priority={priority}"]
    if any(a.startswith(("--standalone", "--peering", "--priority")) for a in argv):
        mode = []
    return [
        "run",
        *mode,
        "-m",
        "eddyline_operator",
        f"--liveness={liveness}",
        *scope,
        *argv,
    ]


def main(argv: Sequence[str] | None = None) -> int:
    import kopf.cli

    # This package was imported before kopf (as the script's parent), so its __init__ did
    # not register the handlers, and `kopf run -m` will not import it again.
    from eddyline_operator import handlers, metrics, profiling  # noqa: F401

    profiling.start()  # EDDYLINE_OPERATOR_PROFILE=<file>: a CPU profile, written at exit

    args = kopf_arguments(sys.argv[1:] if argv is None else argv, dict(os.environ))
    address = os.environ.get(metrics.METRICS_ENV, "").strip()
    if address:
        # Before kopf starts: a port taken or a bad address stops the operator at once,
        # with the message saying which setting to change.
        metrics.serve(address)
    kopf.cli.main(args=args, prog_name="eddyline-operator")
    return 0


if __name__ == "__main__":
    sys.exit(main())

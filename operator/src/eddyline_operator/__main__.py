"""``eddyline-operator``: run the operator under kopf with eddyline's defaults.

The same as ``kopf run --standalone -m eddyline_operator`` plus a liveness
endpoint and the namespaces to watch, from the environment the Helm chart
sets: ``WATCH_NAMESPACES`` (comma-separated; empty = every namespace) and
``EDDYLINE_OPERATOR_LIVENESS`` (default ``http://0.0.0.0:8080/healthz``).
Extra arguments go to ``kopf run`` unchanged.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence

DEFAULT_LIVENESS = "http://0.0.0.0:8080/healthz"


def kopf_arguments(argv: Sequence[str], environ: dict[str, str]) -> list[str]:
    """The ``kopf run`` command line for these arguments and environment."""
    namespaces = [n.strip() for n in environ.get("WATCH_NAMESPACES", "").split(",") if n.strip()]
    scope = [f"--namespace={n}" for n in namespaces] or ["--all-namespaces"]
    if any(a.startswith(("--namespace", "-n", "--all-namespaces", "-A")) for a in argv):
        scope = []
    liveness = environ.get("EDDYLINE_OPERATOR_LIVENESS", DEFAULT_LIVENESS)
    return [
        "run",
        "--standalone",
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
    from eddyline_operator import handlers  # noqa: F401

    args = kopf_arguments(sys.argv[1:] if argv is None else argv, dict(os.environ))
    kopf.cli.main(args=args, prog_name="eddyline-operator")
    return 0


if __name__ == "__main__":
    sys.exit(main())

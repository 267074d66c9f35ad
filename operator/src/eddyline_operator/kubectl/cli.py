"""``kubectl-eddyline``: the plugin's arguments, output format and exit codes.

kubectl runs it as ``kubectl eddyline ...`` and passes every argument after the plugin's
name unchanged; flags before it (``kubectl -n x eddyline``) are refused by kubectl itself,
so the plugin takes kubectl's ``-n``/``--namespace``, ``--context`` and ``--kubeconfig``.
Every failure is one ``error:`` line on stderr and exit code 1; ``upgrade`` exits 2 when
the operator rolled the new revision back.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from dataclasses import asdict
from typing import TextIO

from eddyline_operator.client import ApiError, Kube, kubeconfig_client
from eddyline_operator.kubectl import commands
from eddyline_operator.kubectl.commands import KeyPlace, PluginError
from eddyline_operator.kubectl.render import Style, render_status
from eddyline_operator.kubectl.status_view import camel_case
from eddyline_operator.reconcile import names
from eddyline_runtime.progress import progress_wanted

# Exit codes: 0 done, 1 an error, 2 an upgrade the operator rolled back.
EXIT_ERROR, EXIT_ROLLED_BACK = 1, 2
# Bounds for a busy operator, not expectations: it records a pause within a cycle (about a
# second); an upgrade stops and starts every pod, and rolls back after the app's own
# spec.topology.upgradeDeadlineSeconds (300 s by default).
PAUSE_WAIT_SECONDS = 60.0
UPGRADE_WAIT_SECONDS = 900.0


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(
        prog="kubectl eddyline",
        description="Look at and steer eddyline StreamApps (through the API server only).",
    )
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("-n", "--namespace", help="the app's namespace (default: the context's)")
    common.add_argument("--context", help="the kubeconfig context (default: the current one)")
    common.add_argument("--kubeconfig", help="the kubeconfig file (default: as kubectl finds it)")
    common.add_argument(
        "-o", "--output", choices=("text", "json"), default="text", help="json: for scripts"
    )
    sub = top.add_subparsers(dest="command", required=True, metavar="COMMAND")

    status = sub.add_parser(
        "status",
        parents=[common],
        help="revision, conditions, every task's copies per pod and zone, lags, upgrades, "
        "restore Jobs, autoscaling",
    )
    status.add_argument("app")

    where = sub.add_parser(
        "where", parents=[common], help="the partition and pods that serve a key"
    )
    where.add_argument("app")
    where.add_argument("key", help="the key as text (the store's key serde reads it)")
    where.add_argument("--store", help="the store (default: the app's only one)")

    for verb, text in (
        ("pause", f"stop the operator changing the app ({names.ANNOTATION_PAUSE}=true)"),
        ("resume", f"let the operator reconcile the app again (removes {names.ANNOTATION_PAUSE})"),
    ):
        command = sub.add_parser(verb, parents=[common], help=text)
        command.add_argument("app")
        command.add_argument(
            "--timeout",
            type=float,
            default=PAUSE_WAIT_SECONDS,
            help="seconds to wait for the operator to record it (default %(default).0f)",
        )

    upgrade = sub.add_parser(
        "upgrade",
        parents=[common],
        help="change the topology (a full-cluster upgrade) and follow it until it runs or "
        "is rolled back",
    )
    upgrade.add_argument("app")
    upgrade.add_argument("--topology", required=True, metavar="REF", help="module:function")
    upgrade.add_argument("--revision", help="the new revision (default: the current one + 1)")
    upgrade.add_argument(
        "--timeout",
        type=float,
        default=UPGRADE_WAIT_SECONDS,
        help="seconds to follow it (default %(default).0f); it goes on after that",
    )
    upgrade.add_argument("--no-wait", action="store_true", help="ask for it and return")
    upgrade.add_argument(
        "--no-progress",
        action="store_true",
        help="no live progress line (automatic when stdout is not a terminal)",
    )
    return top


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    out: TextIO = sys.stdout
    try:
        kube, default_namespace = kubeconfig_client(args.kubeconfig, args.context)
        namespace = args.namespace or default_namespace
        return _run(args, kube, namespace, out)
    except PluginError as error:
        print(f"error: {error}", file=sys.stderr)
        return EXIT_ERROR
    except ApiError as error:
        print(f"error: {error}", file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:
        return 130
    except Exception as error:  # the API server unreachable, a reply that is not JSON
        print(
            f"error: {type(error).__name__}: {error} (is the API server of the kubeconfig's "
            "context reachable? `kubectl get streamapps` checks)",
            file=sys.stderr,
        )
        return EXIT_ERROR


def _run(args: argparse.Namespace, kube: Kube, namespace: str, out: TextIO) -> int:
    style = Style.for_stream(out)
    as_json = args.output == "json"
    if args.command == "status":
        view = commands.read_view(kube, namespace, args.app)
        if as_json:
            print(json.dumps(view.to_json(), indent=2), file=out)
        else:
            out.write(render_status(view, style, commands.now()))
        return 0
    if args.command == "where":
        place = commands.where(kube, namespace, args.app, args.key, args.store)
        text = json.dumps(camel_case(asdict(place)), indent=2) if as_json else _place_text(place)
        print(text, file=out)
        return 0
    if args.command in ("pause", "resume"):
        paused = args.command == "pause"
        status = commands.set_paused(
            kube, namespace, args.app, paused=paused, wait_seconds=args.timeout
        )
        if as_json:
            print(json.dumps({"name": args.app, "paused": paused}), file=out)
        elif paused:
            print(
                f"{args.app}: reconciliation paused; the operator changes nothing until "
                f"`kubectl eddyline resume {args.app}`",
                file=out,
            )
        else:
            phase = status.phase.value if status.phase else "-"
            print(f"{args.app}: reconciliation resumed (phase {phase})", file=out)
        return 0
    if args.command == "upgrade":
        progress = progress_wanted(out, no_progress=args.no_progress) and not as_json
        ran = commands.upgrade(
            kube,
            namespace,
            args.app,
            ref=args.topology,
            revision=args.revision,
            wait_seconds=None if args.no_wait else args.timeout,
            out=sys.stderr if as_json else out,
            style=Style(colour=False, width=None) if as_json else style,
            progress=progress,
        )
        if as_json:
            view = commands.read_view(kube, namespace, args.app)
            print(json.dumps(view.to_json(), indent=2), file=out)
        return 0 if ran else EXIT_ROLLED_BACK
    raise PluginError(f"unknown command {args.command!r}")  # argparse refuses it first


def _place_text(place: KeyPlace) -> str:
    def host(h: commands.Host) -> str:
        where = h.pod or h.address
        return f"{where} ({h.zone})" if h.zone else where

    task = f" (task {place.task})" if place.task else ""
    lines = [
        f'key "{place.key}" of store "{place.store}": partition {place.partition}{task}',
        f"  active:   {host(place.active) if place.active else 'none (being reassigned)'}",
        f"  standbys: {', '.join(host(h) for h in place.standbys) or 'none'}",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())

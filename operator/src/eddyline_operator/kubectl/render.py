"""Text for a terminal or a log: tables that fit the width, colour only where it helps.

Colour and width follow the output: on a terminal, ANSI colours (unless ``NO_COLOR`` is set,
https://no-color.org) and cells cut to the terminal's width; anywhere else (a pipe, a file,
a CI log) plain text and whole lines, so nothing a script greps for is cut off.
"""

from __future__ import annotations

import datetime
import os
import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TextIO

from eddyline_operator.kubectl.status_view import AppView, Copy
from eddyline_runtime.spec import Condition, StreamAppStatus, UpgradeStepRecord

_RESET = "\033[0m"
_COLOURS = {"green": "\033[32m", "red": "\033[31m", "yellow": "\033[33m", "bold": "\033[1m"}
# Below this many columns a table is not worth cutting: whole lines wrap instead.
_NARROWEST = 40


@dataclass(frozen=True)
class Style:
    colour: bool
    # Columns to fit a line into; None: whole lines (not a terminal).
    width: int | None

    @classmethod
    def for_stream(cls, stream: TextIO) -> Style:
        tty = stream.isatty()
        colour = tty and "NO_COLOR" not in os.environ and os.environ.get("TERM") != "dumb"
        width = shutil.get_terminal_size().columns if tty else None
        return cls(colour=colour, width=width if width and width >= _NARROWEST else None)

    def paint(self, text: str, colour: str) -> str:
        return f"{_COLOURS[colour]}{text}{_RESET}" if self.colour and colour else text

    def fit(self, line: str) -> str:
        """``line`` cut to the width (its colour codes do not count)."""
        if self.width is None or _visible_len(line) <= self.width:
            return line
        out, seen, index = [], 0, 0
        while index < len(line) and seen < self.width - 1:
            if line.startswith("\033[", index):
                end = line.index("m", index) + 1
                out.append(line[index:end])
                index = end
                continue
            out.append(line[index])
            seen += 1
            index += 1
        return "".join(out) + "…" + (_RESET if self.colour else "")


def _visible_len(text: str) -> int:
    length, index = 0, 0
    while index < len(text):
        if text.startswith("\033[", index):
            index = text.index("m", index) + 1
            continue
        length += 1
        index += 1
    return length


def table(style: Style, header: Sequence[str], rows: Sequence[Sequence[tuple[str, str]]]) -> str:
    """Columns padded to their widest cell; each cell is (text, colour) and the colour never
    counts toward the width."""
    widths = [len(h) for h in header]
    for row in rows:
        for index, (text, _) in enumerate(row):
            widths[index] = max(widths[index], len(text))
    lines = ["  " + "  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True)).rstrip()]
    for row in rows:
        cells = [
            style.paint(text, colour) + " " * (width - len(text))
            for (text, colour), width in zip(row, widths, strict=True)
        ]
        lines.append("  " + "  ".join(cells).rstrip())
    return "\n".join(style.fit(line) for line in lines)


def age(timestamp: str | None, now: datetime.datetime) -> str:
    """How long ago an RFC 3339 ``timestamp`` was, in kubectl's short form (5s, 3m, 2h, 4d)."""
    if not timestamp:
        return "-"
    try:
        then = datetime.datetime.fromisoformat(timestamp.replace("Z", "+00:00"))
    except ValueError:
        return timestamp
    seconds = max(0, int((now - then).total_seconds()))
    for unit, size in (("d", 86_400), ("h", 3_600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


def _condition_colour(condition: Condition) -> str:
    good = condition.status.value == ("False" if condition.type == "Degraded" else "True")
    if condition.type in ("Progressing", "Upgrading", "Restoring", "ScalingIn", "Paused"):
        return "yellow" if condition.status.value == "True" else ""
    return "green" if good else "red"


def size_text(size: int | None) -> str:
    """Bytes as people read them, in powers of 1024 as volumes are sized (``Gi``): 812 B,
    4.0 KiB, 12.3 MiB; "-" when unknown."""
    if size is None:
        return "-"
    if size < 1024:
        return f"{size} B"
    value = size / 1024
    for unit in ("KiB", "MiB", "GiB"):
        if value < 1024:
            return f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} TiB"


def _copy_text(copy: Copy) -> str:
    where = f"{copy.pod} {copy.zone}" if copy.zone else copy.pod
    role = "" if copy.role in ("active", "standby", "warmup") else f" {copy.role}"
    lag = "" if copy.lag is None else f" lag {copy.lag}"
    size = "" if copy.disk_bytes is None else f" {size_text(copy.disk_bytes)}"
    return f"{where}{role}{lag}{size}"


def _copy_colour(copy: Copy | None) -> str:
    if copy is None:
        return "red"
    if copy.role in ("restoring", "restorePending"):
        return "yellow"
    return ""


def render_status(view: AppView, style: Style, now: datetime.datetime) -> str:
    status = view.status
    parts: list[str] = []
    phase = status.phase.value if status.phase else "Unknown"
    phase_colour = {"Running": "green", "Degraded": "red"}.get(phase, "yellow")
    parts.append(
        style.fit(
            f"{style.paint(view.name, 'bold')} in {view.namespace}: "
            f"{style.paint(phase, phase_colour)}"
            + (f"  {style.paint('PAUSED', 'yellow')}" if view.paused else "")
        )
    )
    running = status.topology
    summary = [
        f"revision {status.revision or '-'}",
        f"topology {running if running else '-'}"
        + (f" (describe hash {view.topology_hash})" if view.topology_hash else ""),
    ]
    if running is None or str(running) != view.spec_topology:
        summary.append(f"spec asks {view.spec_topology}")
    parts.append(style.fit("  " + ", ".join(summary)))
    parts.append(style.fit("  " + _draw_hint(view)))
    parts.append(
        style.fit(
            f"  pods {status.ready_replicas or 0}/{status.replicas or 0} ready, "
            f"generation {status.observed_generation or '-'} of {view.generation or '-'} "
            f"observed, membership generation {view.membership_generation or '-'}"
            + (
                f", max standby lag {status.max_standby_lag}"
                if status.max_standby_lag is not None
                else ""
            )
        )
    )
    if status.message:
        parts.append(style.fit(f"  {status.message}"))

    parts.append("\nConditions")
    parts.append(
        table(
            style,
            ("TYPE", "STATUS", "REASON", "AGE", "MESSAGE"),
            [
                (
                    (c.type, ""),
                    (c.status.value, _condition_colour(c)),
                    (c.reason, ""),
                    (age(c.last_transition_time, now), ""),
                    (c.message, ""),
                )
                for c in status.conditions
            ],
        )
        if status.conditions
        else "  none yet"
    )

    parts.append("\nPods")
    parts.append(
        table(
            style,
            (
                "POD",
                "ZONE",
                "NODE",
                "PHASE",
                "READY",
                "ACTIVE",
                "STANDBY",
                "BUSY",
                "REC/S",
                "INPUT LAG",
                "ON DISK",
                "LAYOUT",
            ),
            [
                (
                    (p.name, ""),
                    (p.zone or "-", ""),
                    (p.node or "-", ""),
                    (p.phase, "" if p.phase == "Running" else "yellow"),
                    ("yes" if p.ready else "no", "green" if p.ready else "red"),
                    (str(p.active) if p.member else "-", ""),
                    (str(p.standby) if p.member else "-", ""),
                    ("-" if p.busy is None else f"{p.busy:.0%}", ""),
                    ("-" if p.rate is None else f"{p.rate:g}", ""),
                    ("-" if p.input_lag is None else str(p.input_lag), ""),
                    (size_text(p.store_bytes), ""),
                    (
                        p.layout_error or f"hash {p.topology_hash}",
                        "yellow" if p.layout_error else "",
                    ),
                )
                for p in view.pods
            ],
        )
        if view.pods
        else "  none"
    )

    parts.append("\nTasks (copies: pod, zone, lag in records, size on disk)")
    if view.tasks:
        parts.append(
            table(
                style,
                ("TASK", "ACTIVE", "STANDBYS", "WARM-UPS"),
                [
                    (
                        (t.task, ""),
                        (_copy_text(t.active) if t.active else "none", _copy_colour(t.active)),
                        (
                            "; ".join(_copy_text(c) for c in t.standbys) or "-",
                            next((_copy_colour(c) for c in t.standbys if _copy_colour(c)), ""),
                        ),
                        ("; ".join(_copy_text(c) for c in t.warmups) or "-", ""),
                    )
                    for t in view.tasks
                ],
            )
        )
        if view.stores:
            owners = ", ".join(f"{s} (sub-topology {sub})" for s, sub in view.stores.items())
            parts.append(style.fit(f"  stores: {owners}"))
    else:
        parts.append("  no membership published yet")

    parts.extend(_upgrades(status, style, now))
    parts.extend(_restore_jobs(status, style, now))
    parts.extend(_autoscaling(status, style, now))
    # Every line fits, whichever section built it.
    return "\n".join(style.fit(line) for line in "\n".join(parts).splitlines()) + "\n"


def _draw_hint(view: AppView) -> str:
    """How to draw the topology that runs, and how to check a manifest is that topology."""
    if view.topology_hash is None:
        return f"draw it: {view.draw_command} (no pod has reported its describe hash yet)"
    return (
        f"draw it: {view.draw_command} (MANIFEST: {view.name}'s StreamApp YAML; --hash on "
        f"it prints {view.topology_hash} if it is this topology)"
    )


def step_lines(steps: Sequence[UpgradeStepRecord], style: Style, until: str | None) -> list[str]:
    """Each step with its start and how long it took (until the next step, or ``until``)."""
    lines = []
    for index, step in enumerate(steps):
        end = steps[index + 1].started_at if index + 1 < len(steps) else until
        took = _between(step.started_at, end)
        lines.append(style.fit(f"    {step.started_at}  {step.step:<20} {took}".rstrip()))
    return lines


def _between(start: str, end: str | None) -> str:
    if end is None:
        return "(under way)"
    try:
        begun = datetime.datetime.fromisoformat(start.replace("Z", "+00:00"))
        ended = datetime.datetime.fromisoformat(end.replace("Z", "+00:00"))
    except ValueError:
        return ""
    return f"{(ended - begun).total_seconds():.0f} s"


def _upgrades(status: StreamAppStatus, style: Style, now: datetime.datetime) -> list[str]:
    lines = []
    if status.upgrade is not None:
        under_way = status.upgrade
        lines.append(
            "\n"
            + style.paint("Upgrade under way", "yellow")
            + f": {under_way.from_topology} -> {under_way.to_topology}, step {under_way.step}"
        )
        if under_way.rollback is not None:
            lines.append(style.fit(f"  rolling back: {under_way.rollback.message}"))
        lines.extend(step_lines(under_way.steps, style, None))
    last = status.last_upgrade
    if last is not None:
        colour = "green" if last.outcome.value == "Succeeded" else "red"
        lines.append(
            f"\nLast upgrade: {last.from_topology} -> {last.to_topology}, "
            f"{style.paint(last.outcome.value, colour)} {age(last.finished_at, now)} ago"
        )
        if last.rollback is not None:
            pod = f" on {last.rollback.pod}" if last.rollback.pod else ""
            lines.append(
                style.fit(f"  rolled back: {last.rollback.reason}{pod}: {last.rollback.message}")
            )
        lines.extend(step_lines(last.steps, style, last.finished_at))
    if status.failed_topology is not None:
        lines.append(style.fit(f"  not tried again until spec.topology changes: "
                               f"{status.failed_topology}"))  # fmt: skip
    return lines


def _restore_jobs(status: StreamAppStatus, style: Style, now: datetime.datetime) -> list[str]:
    if not status.restore_jobs:
        return []
    colours = {"Running": "yellow", "Succeeded": "green", "Failed": "red"}
    return [
        "\nRestore Jobs",
        table(
            style,
            ("JOB", "STORE", "PARTITIONS", "STATE", "STARTED", "FINISHED", "MESSAGE"),
            [
                (
                    (j.name, ""),
                    (j.store, ""),
                    (",".join(str(p) for p in j.partitions) or "-", ""),
                    (j.state.value, colours.get(j.state.value, "")),
                    (age(j.started_at, now), ""),
                    (age(j.finished_at, now), ""),
                    (j.message, ""),
                )
                for j in status.restore_jobs
            ],
        ),
    ]


def _autoscaling(status: StreamAppStatus, style: Style, now: datetime.datetime) -> list[str]:
    scaling = status.autoscaling
    if scaling is None or (scaling.desired_replicas is None and scaling.last_decision is None):
        return []
    lines = [
        "\nAutoscaler",
        f"  replicas {scaling.current_replicas if scaling.current_replicas is not None else '-'}"
        f", desired {scaling.desired_replicas if scaling.desired_replicas is not None else '-'}",
    ]
    decision = scaling.last_decision
    if decision is not None:
        lines.append(
            style.fit(
                f"  last decision {age(decision.time, now)} ago: {decision.from_replicas} -> "
                f"{decision.to_replicas}: {decision.reason}"
            )
        )
    return lines

"""Many replicas on one machine: ``eddyline run`` with ``spec.replicas`` > 1.

The local stand-in for what the operator and Kubernetes do for pods. A
:class:`LocalGroup` starts one process per replica, each with its own
``state.dir`` (``<state.dir>/<replica>``) and query port, all sharing the
embedded log. It is the group's membership authority: it computes the
assignment with the same pure :func:`~eddyline_runtime.assignor.assign` the
operator uses and publishes it in a *membership file* that every replica
polls. When a replica dies it republishes without it (its standbys are
promoted, restoring only their tail), restarts it after a short back-off, and
republishes with it again (tasks move back only as far as balance needs).

Safety does not depend on replicas reading the file in time: under
exactly-once every task writes with its own transactional id, and taking a
task over fences the previous owner (see ``processing/stream_thread.py``).
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from eddyline_runtime.assignor import Assignment, Member, assign
from eddyline_runtime.errors import EddylineError
from eddyline_runtime.membership import MEMBERSHIP_FILE, Membership
from eddyline_runtime.processing.topics import TopicLayout

logger = logging.getLogger(__name__)

DEFAULT_ZONES = ("zone-a", "zone-b", "zone-c")
# How long a crashed replica stays out before it is restarted.
RESTART_BACKOFF_SECONDS = 1.0


@dataclass
class _Replica:
    member: Member
    process: subprocess.Popen[bytes] | None = None
    restart_at: float | None = None
    restarts: int = 0
    log_path: Path | None = None


@dataclass
class LocalGroup:
    """Supervises the replicas of one app; see the module docstring."""

    manifest: Path
    replicas: int
    layout: TopicLayout
    num_standby_replicas: int
    state_dir: Path
    zones: Sequence[str] = ()
    host: str = "127.0.0.1"
    base_port: int = 7070
    config_file: Path | None = None
    logs_dir: Path | None = None
    extra_env: Mapping[str, str] = field(default_factory=dict)
    generation: int = 0
    assignment: Assignment | None = None
    _replicas: dict[str, _Replica] = field(default_factory=dict)

    def __post_init__(self) -> None:
        zones = list(self.zones) or list(DEFAULT_ZONES)
        for index in range(self.replicas):
            member = Member(
                str(index),
                zone=zones[index % len(zones)],
                address=f"{self.host}:{self.base_port + index}",
            )
            self._replicas[member.id] = _Replica(member)

    @property
    def membership_file(self) -> Path:
        return self.state_dir / MEMBERSHIP_FILE

    @property
    def members(self) -> list[Member]:
        return [replica.member for replica in self._replicas.values()]

    def start(self) -> None:
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self._publish()
        for replica in self._replicas.values():
            self._spawn(replica)

    def poll(self) -> list[str]:
        """Notice dead replicas and restart due ones; returns what happened, for display."""
        events: list[str] = []
        now = time.monotonic()
        changed = False
        for replica in self._replicas.values():
            process = replica.process
            if process is not None and process.poll() is not None:
                exit_status = _exit_description(process.returncode)
                events.append(
                    f"replica {replica.member.id} exited with {exit_status}; its tasks move to "
                    f"the others, restart in {RESTART_BACKOFF_SECONDS:.0f} s"
                )
                replica.process = None
                replica.restart_at = now + RESTART_BACKOFF_SECONDS
                changed = True
        if changed:
            self._publish()
        for replica in self._replicas.values():
            if (
                replica.process is None
                and replica.restart_at is not None
                and now >= replica.restart_at
            ):
                replica.restart_at = None
                replica.restarts += 1
                self._spawn(replica)
                self._publish()
                events.append(f"replica {replica.member.id} restarted")
        return events

    def kill(self, member_id: str, sig: int = signal.SIGKILL) -> None:
        """Send ``sig`` to a replica (the demo's and tests' way to crash one)."""
        process = self._replicas[member_id].process
        if process is None:
            raise EddylineError(f"replica {member_id} is not running")
        process.send_signal(sig)

    def alive(self) -> list[str]:
        return [
            m
            for m, r in self._replicas.items()
            if r.process is not None and r.process.poll() is None
        ]

    def pid(self, member_id: str) -> int | None:
        process = self._replicas[member_id].process
        return None if process is None else process.pid

    def stop(self, timeout: float = 30.0) -> dict[str, int | None]:
        """SIGTERM every replica (each commits and closes), then wait; returns exit codes."""
        for replica in self._replicas.values():
            if replica.process is not None and replica.process.poll() is None:
                replica.process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout
        codes: dict[str, int | None] = {}
        for member_id, replica in self._replicas.items():
            if replica.process is None:
                codes[member_id] = None
                continue
            try:
                codes[member_id] = replica.process.wait(max(deadline - time.monotonic(), 0.1))
            except subprocess.TimeoutExpired:
                replica.process.kill()
                codes[member_id] = replica.process.wait()
            replica.restart_at = None
        return codes

    def _publish(self) -> None:
        present = [r.member for r in self._replicas.values() if r.restart_at is None]
        if not present:
            return  # every replica is down: keep the last assignment until one returns
        self.assignment = assign(
            self.layout.tasks(),
            present,
            self.num_standby_replicas,
            previous=self.assignment,
            stateful=self.layout.stateful_tasks(),
        )
        self.generation += 1
        Membership(self.generation, self.assignment).write(self.membership_file)

    def _spawn(self, replica: _Replica) -> None:
        member = replica.member
        command = [
            sys.executable,
            "-m",
            "eddyline_runtime.cli",
            "run",
            str(self.manifest),
            "--instance-id",
            member.id,
            "--member-file",
            str(self.membership_file),
        ]
        if self.config_file is not None:
            command += ["--config", str(self.config_file)]
        env = {
            **os.environ,
            **self.extra_env,
            "EDDYLINE_STATE_DIR": str(self.state_dir / member.id),
            "EDDYLINE_APPLICATION_SERVER": member.address or "",
            "PYTHONUNBUFFERED": "1",
        }
        output: Any = subprocess.DEVNULL
        if self.logs_dir is not None:
            self.logs_dir.mkdir(parents=True, exist_ok=True)
            replica.log_path = self.logs_dir / f"replica-{member.id}.log"
            output = replica.log_path.open("ab")
        try:
            replica.process = subprocess.Popen(
                command, env=env, stdout=output, stderr=subprocess.STDOUT
            )
        finally:
            if output is not subprocess.DEVNULL:
                output.close()


def _exit_description(code: int) -> str:
    if code < 0:
        return f"signal {signal.Signals(-code).name}"
    return f"code {code}"

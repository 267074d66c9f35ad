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
task over fences the previous owner (see ``engine/stream_thread.py``).

Scaling (:meth:`LocalGroup.scale`) warms before moving (KIP-441, assignor
points 9 to 11): a replica that joins gets warm-up replicas, and a stateful
task moves to it only once it reports its copy caught up. While the
assignment is not yet the balanced target, the group reads every replica's
``GET /v1/layout`` (the lags of its store copies) each
:data:`LAG_READ_SECONDS` and republishes as soon as that changes the
assignment; at the latest every ``probing.rebalance.interval.ms`` it
recomputes anyway.

What a kubelet does for pods, the group does for replicas:

* **liveness**: a replica that stops answering ``GET /healthz`` (within
  :data:`PROBE_TIMEOUT_SECONDS`, for :data:`LIVENESS_FAILURE_SECONDS` in a
  row; a hung or SIGSTOPped process) is treated as dead: the group
  republishes without it at once, then kills and restarts it. Liveness is
  the supervisor's own view and never enters the published membership, so
  the membership keeps one writer; fencing keeps a replica that wakes up
  late from committing for tasks it lost;
* **a lifeline**: each replica watches the read end of a pipe whose write
  end only the supervisor holds. When the supervisor dies, even by SIGKILL,
  the pipe reaches end-of-file and the replica commits, closes and exits,
  so it never keeps ports and store locks from the next supervisor. A pipe
  works on every OS, unlike Linux's parent-death signal;
* **output**: each replica's output goes to the supervisor's terminal with a
  ``[replica N]`` prefix, or, with ``logs_dir``, to ``replica-N.log`` there,
  which the supervisor names when it reports the replica's exit.
"""

from __future__ import annotations

import http.client
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, TextIO

from eddyline_runtime.assignor import (
    DEFAULT_ACCEPTABLE_RECOVERY_LAG,
    DEFAULT_MAX_WARMUP_REPLICAS,
    Assignment,
    Member,
    assign,
)
from eddyline_runtime.engine.topics import TopicLayout
from eddyline_runtime.errors import EddylineError
from eddyline_runtime.membership import (
    MEMBERSHIP_FILE,
    MemberReport,
    Membership,
    warmup_policy,
)
from eddyline_runtime.partitions import TaskId
from eddyline_runtime.state.state_directory import DirectoryLock, LockHolder

logger = logging.getLogger(__name__)

DEFAULT_ZONES = ("zone-a", "zone-b", "zone-c")
# How long a crashed replica stays out before it is restarted.
RESTART_BACKOFF_SECONDS = 1.0
# A liveness probe (GET /healthz) waits this long for an answer, as a kubelet's
# timeoutSeconds; probes run this often (periodSeconds).
PROBE_TIMEOUT_SECONDS = 2.0
PROBE_PERIOD_SECONDS = 0.5
# A replica that answered no probe for this long is hung: the kubelet's
# failureThreshold x periodSeconds. Several probe timeouts, so one slow answer
# under load is not a death sentence.
LIVENESS_FAILURE_SECONDS = 10.0
# A replica gets this long to answer its first probe (loading its topology,
# opening stores): a kubelet's startup probe.
STARTUP_SECONDS = 60.0
# While warm-ups run, how often the replicas' lags are read (the probing trigger).
LAG_READ_SECONDS = 0.5
# Kafka Streams' probing.rebalance.interval.ms default: the latest a recompute happens.
DEFAULT_PROBING_REBALANCE_INTERVAL_MS = 10 * 60 * 1000


@dataclass
class _Replica:
    member: Member
    process: subprocess.Popen[bytes] | None = None
    restart_at: float | None = None
    restarts: int = 0
    log_path: Path | None = None
    # The write end of the replica's lifeline pipe (see the module docstring).
    lifeline: int | None = None
    started_at: float = 0.0
    last_alive: float | None = None  # when it last answered /healthz


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
    # Where replica output goes without logs_dir, each line prefixed "[replica N] ".
    out: TextIO | None = None
    generation: int = 0
    assignment: Assignment | None = None
    # KIP-441 (StreamsConfig's keys); warm_up False moves tasks at once, restoring cold.
    warm_up: bool = True
    acceptable_recovery_lag: int = DEFAULT_ACCEPTABLE_RECOVERY_LAG
    max_warmup_replicas: int = DEFAULT_MAX_WARMUP_REPLICAS
    probing_rebalance_interval_ms: int = DEFAULT_PROBING_REBALANCE_INTERVAL_MS
    # Whether the assignment in force is the balanced target (no warm-up pending).
    balanced: bool = True
    _replicas: dict[str, _Replica] = field(default_factory=dict)
    # What each replica last reported (its copies' lags and staleness).
    _reports: dict[str, MemberReport] = field(default_factory=dict)
    _next_lag_read: float = 0.0
    _next_probing: float = 0.0
    # Held from start() to stop(): one supervisor per state directory.
    _lock: DirectoryLock | None = None

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
        if self.logs_dir is not None and self.logs_dir.exists() and not self.logs_dir.is_dir():
            raise EddylineError(
                f"--logs-dir {self.logs_dir} is a file; give a directory (created if missing)"
            )
        # Two supervisors on one state directory would both publish the
        # membership file and start replicas that fight over ports and store
        # locks, crash-looping forever: refuse the second at once.
        held = DirectoryLock.try_create(self.state_dir)
        if isinstance(held, LockHolder):
            holder = "another process" if held.pid is None else f"pid {held.pid}"
            raise EddylineError(
                f"another supervisor ({holder}) already runs the replicas of state directory "
                f"{self.state_dir}: stop it first, or give this group another state.dir"
            )
        self._lock = held
        self._publish()
        for replica in self._replicas.values():
            self._spawn(replica)

    def poll(self) -> list[str]:
        """Notice dead and hung replicas, restart due ones; returns what happened, for display."""
        events: list[str] = []
        now = time.monotonic()
        changed = False
        hung: list[subprocess.Popen[bytes]] = []
        for replica in self._replicas.values():
            process = replica.process
            if process is None:
                continue
            if process.poll() is not None:
                exit_status = _exit_description(process.returncode)
                output = "" if replica.log_path is None else f" (its output: {replica.log_path})"
                events.append(
                    f"replica {replica.member.id} exited with {exit_status}{output}; its tasks "
                    f"move to the others, restart in {RESTART_BACKOFF_SECONDS:.0f} s"
                )
            elif self._hung(replica, now):
                events.append(
                    f"replica {replica.member.id} (pid {process.pid}) has not answered "
                    f"/healthz at {replica.member.address} for {self._silence(replica, now):.0f} "
                    f"s; its tasks move to the others, it is killed and restarted in "
                    f"{RESTART_BACKOFF_SECONDS:.0f} s"
                )
                hung.append(process)
            else:
                continue
            self._release(replica)
            replica.restart_at = now + RESTART_BACKOFF_SECONDS
            changed = True
        if changed:
            self._publish()
        for process in hung:  # after the republish: the others take over at once
            process.kill()
            process.wait()
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
        if self.warm_up and (
            (not self.balanced and now >= self._next_lag_read) or now >= self._next_probing
        ):
            events += self._probe(now)
        return events

    def _probe(self, now: float) -> list[str]:
        """A probing rebalance: read the lags, republish if they change the assignment."""
        self._next_lag_read = now + LAG_READ_SECONDS
        self._next_probing = now + self.probing_rebalance_interval_ms / 1000
        self._read_lags()
        before = self.assignment
        computed = self._compute()
        if computed is None or computed == before:
            return []
        self._publish(computed)
        moved = (
            0
            if before is None
            else sum(
                1 for t in computed.tasks if before.active_owner(t) != computed.active_owner(t)
            )
        )
        return [
            f"probing rebalance: {moved} task(s) moved to caught-up copies, "
            f"{computed.warmup_count} warm-up(s) running"
            + ("" if not self.balanced else "; balance reached")
        ]

    def _read_lags(self) -> None:
        """Each running replica's store lags (``GET /v1/layout``); unanswered: unchanged."""
        for replica in self._replicas.values():
            address = replica.member.address
            if not address or replica.process is None or replica.restart_at is not None:
                continue
            host, _, port = address.rpartition(":")
            connection = http.client.HTTPConnection(host, int(port), timeout=PROBE_TIMEOUT_SECONDS)
            try:
                connection.request("GET", "/v1/layout")
                response = connection.getresponse()
                if response.status != 200:
                    continue  # starting: its copies are not open yet
                report = MemberReport.from_json(json.loads(response.read()))
            except (OSError, http.client.HTTPException, ValueError):
                continue  # not answering now: keep what it reported last
            finally:
                connection.close()
            self._reports[replica.member.id] = report

    @property
    def reported_lags(self) -> dict[str, dict[TaskId, int]]:
        """The lags the replicas last reported (a copy): what warm-ups are judged by."""
        return {member_id: report.task_lags() for member_id, report in self._reports.items()}

    def scale(self, replicas: int) -> None:
        """Add replicas up to ``replicas`` (each warms up before tasks move to it), or
        remove the highest-numbered ones: republished without them, then SIGTERMed (each
        commits and closes; its tasks move to standbys, restoring only their tail)."""
        if replicas < 1:
            raise EddylineError(
                f"cannot scale to {replicas} replicas: a group runs at least one "
                "(stop it to run none)"
            )
        zones = list(self.zones) or list(DEFAULT_ZONES)
        while len(self._replicas) < replicas:
            index = len(self._replicas)
            member = Member(
                str(index),
                zone=zones[index % len(zones)],
                address=f"{self.host}:{self.base_port + index}",
            )
            replica = _Replica(member)
            self._replicas[member.id] = replica
            self._publish()
            self._spawn(replica)
        leaving = [self._replicas.pop(str(i)) for i in range(replicas, len(self._replicas))]
        if not leaving:
            return
        for replica in leaving:
            self._reports.pop(replica.member.id, None)
        self._publish()
        for replica in leaving:
            process = replica.process
            self._release(replica)
            if process is not None and process.poll() is None:
                process.send_signal(signal.SIGTERM)
                try:
                    process.wait(30)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait()

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
            self._release(replica)
            replica.restart_at = None
        if self._lock is not None:
            self._lock.release()
            self._lock = None
        return codes

    def answered_probe(self, member_id: str) -> bool:
        """Whether the replica's current process has answered a liveness probe yet (until it
        has, only the startup grace of STARTUP_SECONDS applies to it)."""
        replica = self._replicas[member_id]
        return replica.process is not None and replica.last_alive is not None

    def log_path(self, member_id: str) -> Path | None:
        """The file a replica's output goes to (None: the supervisor's terminal)."""
        return self._replicas[member_id].log_path

    def _hung(self, replica: _Replica, now: float) -> bool:
        if replica.last_alive is None:
            return now - replica.started_at > STARTUP_SECONDS
        return now - replica.last_alive > LIVENESS_FAILURE_SECONDS

    def _silence(self, replica: _Replica, now: float) -> float:
        return now - (replica.last_alive or replica.started_at)

    def _release(self, replica: _Replica) -> None:
        """Forget a replica's process; closing its lifeline tells it to exit if it still runs."""
        replica.process = None
        # What it reported is gone with it; it reports again once it runs.
        self._reports.pop(replica.member.id, None)
        if replica.lifeline is not None:
            os.close(replica.lifeline)
            replica.lifeline = None

    def _compute(self) -> Assignment | None:
        """The assignment for the replicas present (None: none is); sets ``balanced``."""
        present = [r.member for r in self._replicas.values() if r.restart_at is None]
        if not present:
            return None
        target = assign(
            self.layout.tasks(),
            present,
            self.num_standby_replicas,
            previous=self.assignment,
            stateful=self.layout.stateful_tasks(),
        )
        if not self.warm_up:
            self.balanced = True
            return target
        computed = assign(
            self.layout.tasks(),
            present,
            self.num_standby_replicas,
            previous=self.assignment,
            stateful=self.layout.stateful_tasks(),
            warmups=warmup_policy(
                self._reports,
                acceptable_recovery_lag=self.acceptable_recovery_lag,
                max_warmup_replicas=self.max_warmup_replicas,
            ),
        )
        self.balanced = computed == target
        return computed

    def _publish(self, computed: Assignment | None = None) -> None:
        if computed is None:
            computed = self._compute()
        if computed is None:
            return  # every replica is down: keep the last assignment until one returns
        self.assignment = computed
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
        output: Any = subprocess.PIPE
        if self.logs_dir is not None:
            self.logs_dir.mkdir(parents=True, exist_ok=True)
            replica.log_path = self.logs_dir / f"replica-{member.id}.log"
            output = replica.log_path.open("ab")
        # Only this process holds the write end: it closes when we die (see the docstring).
        lifeline_read, lifeline_write = os.pipe()
        command += ["--supervisor-fd", str(lifeline_read)]
        try:
            process = subprocess.Popen(
                command,
                env=env,
                stdout=output,
                stderr=subprocess.STDOUT,
                pass_fds=(lifeline_read,),
            )
        except BaseException:
            os.close(lifeline_write)
            raise
        finally:
            os.close(lifeline_read)
            if output is not subprocess.PIPE:
                output.close()
        replica.process = process
        replica.lifeline = lifeline_write
        replica.started_at = time.monotonic()
        replica.last_alive = None
        if process.stdout is not None:
            threading.Thread(
                target=_forward_output,
                args=(process.stdout, f"[replica {member.id}] ", self.out or sys.stderr),
                name=f"eddyline-replica-{member.id}-output",
                daemon=True,
            ).start()
        if member.address:
            threading.Thread(
                target=self._probe_liveness,
                args=(replica, process, member.address),
                name=f"eddyline-replica-{member.id}-liveness",
                daemon=True,
            ).start()

    def _probe_liveness(
        self, replica: _Replica, process: subprocess.Popen[bytes], address: str
    ) -> None:
        """GET /healthz every PROBE_PERIOD_SECONDS while this process is the replica's."""
        host, _, port = address.rpartition(":")
        while replica.process is process and process.poll() is None:
            connection = http.client.HTTPConnection(host, int(port), timeout=PROBE_TIMEOUT_SECONDS)
            try:
                connection.request("GET", "/healthz")
                if connection.getresponse().status == 200:
                    replica.last_alive = time.monotonic()
            except (OSError, http.client.HTTPException):
                pass  # refused or timed out: not alive (503 is a failed stream thread)
            finally:
                connection.close()
            time.sleep(PROBE_PERIOD_SECONDS)


def _forward_output(stream: IO[bytes], prefix: str, out: TextIO) -> None:
    """Copy a replica's output lines to ``out``, prefixed unless the replica did it."""
    with stream:
        for raw in stream:
            line = raw.decode(errors="replace").rstrip("\n")
            try:
                print(line if line.startswith(prefix) else prefix + line, file=out, flush=True)
            except (OSError, ValueError):
                return  # our own output is gone (closed terminal): stop copying


def _exit_description(code: int) -> str:
    if code < 0:
        return f"signal {signal.Signals(-code).name}"
    return f"code {code}"

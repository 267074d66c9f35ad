"""Run a StreamApp manifest locally: ``eddyline run MANIFEST``.

Loads the manifest (the same pydantic model the operator uses), imports the
topology it names and opens its log. Then, by ``spec.replicas``:

* one replica: one instance runs every task in this process, until
  SIGINT/SIGTERM, or with ``until_caught_up`` until all input is processed
  and committed; it serves interactive queries when ``application.server``
  is set;
* several: a :class:`~eddyline_runtime.local_group.LocalGroup` starts one
  process per replica (each runs :func:`run_member`), publishes their
  assignment, restarts crashed or hung ones, and prints where to query them;
  with ``until_caught_up`` it stops them once all input is committed;
* a pod of a cluster (``--membership-configmap``): :func:`run_cluster_member`
  starts with no tasks, reports its layout on ``/v1/layout`` and runs the
  share of the assignment the operator publishes (docs/operator.md).

"Caught up" always means what the log says: every input and repartition
partition's committed offset is at its end offset (:func:`uncommitted_inputs`),
never only that an instance has nothing left to do: an instance fenced out
of its tasks holds nothing and would look done.

Every instance closes cleanly on SIGINT/SIGTERM: a final commit, stores closed.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from types import FrameType
from typing import TextIO

from eddyline_runtime.assignor import Assignment, Member
from eddyline_runtime.cluster_membership import (
    SERVICE_ACCOUNT_DIR,
    ApiServer,
    ConfigMapMembership,
)
from eddyline_runtime.config import StreamsConfig, read_settings_file
from eddyline_runtime.engine.instance import StreamsInstance
from eddyline_runtime.engine.queryable import HostInfo
from eddyline_runtime.engine.topics import TopicLayout, resolve_topics
from eddyline_runtime.errors import ConfigError, EddylineError
from eddyline_runtime.local_group import LocalGroup
from eddyline_runtime.log import Log, open_log
from eddyline_runtime.membership import Membership
from eddyline_runtime.partitions import TaskId, TopicPartition
from eddyline_runtime.processing.loader import load_topology
from eddyline_runtime.query.server import QueryServer
from eddyline_runtime.spec import StreamApp, load_manifest

logger = logging.getLogger(__name__)

_PROGRESS_SECONDS = 1.0
_MEMBERSHIP_POLL_SECONDS = 0.1
# A pod checks the watched membership this often (a memory read; the watch itself is pushed).
_CLUSTER_TICK_SECONDS = 0.05
# Replica i of a local group answers queries on DEFAULT_QUERY_PORT + i.
DEFAULT_QUERY_PORT = 7070


def standby_cap_warning(replicas: int, num_standby_replicas: int) -> str | None:
    """What to tell a user whose ``num.standby.replicas`` the assignor must cap.

    A standby never shares a member with its task's active copy, so ``replicas``
    members hold at most ``replicas - 1`` standbys of a task. Not an error:
    scaling a group down below its standby count must keep working.
    """
    if num_standby_replicas < replicas:
        return None
    return (
        f"num.standby.replicas is {num_standby_replicas} but spec.replicas is {replicas}: "
        f"each stateful task gets {replicas - 1} standby replica(s), as a standby never runs "
        f"on its active copy's member; set spec.replicas to {num_standby_replicas + 1} for "
        "all of them"
    )


def load_app(manifest: Path, config_file: Path | None = None) -> StreamApp:
    """The manifest, with ``config_file`` (``.properties`` or YAML) over its ``spec.config``;
    the environment (``EDDYLINE_<NAME>``) overrides both when the config is built."""
    if manifest.is_dir():
        raise EddylineError(
            f'manifest "{manifest}" is a directory; pass the StreamApp YAML file in it '
            f"(e.g. {manifest / 'streamapp.yaml'})"
        )
    app = load_manifest(manifest)
    if config_file is not None:
        settings = {**app.spec.config, **read_settings_file(config_file)}
        StreamsConfig.from_properties(settings)  # a bad value names its key, here
        app = app.model_copy(update={"spec": app.spec.model_copy(update={"config": settings})})
    return app


def run_manifest(
    manifest: Path,
    *,
    instance_id: str = "0",
    config_file: Path | None = None,
    member_file: Path | None = None,
    membership_configmap: str | None = None,
    log_url: str | None = None,
    supervisor_fd: int | None = None,
    until_caught_up: bool = False,
    logs_dir: Path | None = None,
    timeout: float | None = None,
    out: TextIO = sys.stderr,
    on_started: Callable[[StreamsInstance], None] | None = None,
) -> StreamsInstance | None:
    """Run until stopped (or caught up); returns the closed instance for its metrics
    (None when it supervised a group of replicas). ``log_url`` overrides ``spec.log.url``."""
    app = load_app(manifest, config_file)
    if member_file is None and membership_configmap is None:
        capped = standby_cap_warning(app.spec.replicas, app.streams_config().num_standby_replicas)
        if capped is not None:
            logger.warning(capped)
    if member_file is None and membership_configmap is None and app.spec.replicas > 1:
        run_group(
            manifest,
            app,
            config_file=config_file,
            until_caught_up=until_caught_up,
            logs_dir=logs_dir,
            timeout=timeout,
            out=out,
        )
        return None
    if supervisor_fd is not None:
        _exit_with_supervisor(supervisor_fd)
    log = open_log(log_url or app.spec.log.url)
    try:
        if membership_configmap is not None:
            return run_cluster_member(
                app,
                log,
                search_path=[manifest.resolve().parent],
                instance_id=instance_id,
                source=ConfigMapMembership(
                    ApiServer.from_environment(),
                    namespace=pod_namespace(),
                    name=membership_configmap,
                ),
                out=out,
            )
        if member_file is not None:
            return run_member(
                app,
                log,
                search_path=[manifest.resolve().parent],
                instance_id=instance_id,
                member_file=member_file,
                out=out,
            )
        return run_app(
            app,
            log,
            search_path=[manifest.resolve().parent],
            instance_id=instance_id,
            until_caught_up=until_caught_up,
            timeout=timeout,
            out=out,
            on_started=on_started,
        )
    finally:
        log.close()


def run_app(
    app: StreamApp,
    log: Log,
    *,
    search_path: list[Path],
    instance_id: str = "0",
    until_caught_up: bool = False,
    timeout: float | None = None,
    out: TextIO = sys.stderr,
    on_started: Callable[[StreamsInstance], None] | None = None,
) -> StreamsInstance:
    config = app.streams_config()
    topology = load_topology(app.spec.topology.ref, search_path)
    check_state_dir(Path(config.state_dir))
    instance = StreamsInstance(topology, config, log, instance_id=instance_id)

    def finished() -> bool:
        if not until_caught_up:
            return False
        fenced = sum(thread.migrated for thread in instance.threads)
        if fenced:
            raise EddylineError(
                f"{fenced} task(s) of instance {instance_id} were taken over by another "
                f'instance of application "{config.application_id}" (it fenced this one\'s '
                "transactions), so this run cannot finish its input; stop the other instance "
                "(eddyline run with spec.replicas > 1 runs several safely) and run again"
            )
        return (
            instance.caught_up()
            and instance.layout is not None
            and not uncommitted_inputs(log, instance.layout)
        )

    _serve(instance, app, out, finished, tick_seconds=0.05, timeout=timeout, on_started=on_started)
    return instance


def run_member(
    app: StreamApp,
    log: Log,
    *,
    search_path: list[Path],
    instance_id: str,
    member_file: Path,
    out: TextIO = sys.stderr,
) -> StreamsInstance:
    """One replica of a local group: follow the membership file until SIGINT/SIGTERM."""
    config = app.streams_config()
    topology = load_topology(app.spec.topology.ref, search_path)
    check_state_dir(Path(config.state_dir))
    membership = _wait_for_membership(member_file, instance_id)
    instance = StreamsInstance(
        topology,
        config,
        log,
        instance_id=instance_id,
        member=membership.assignment.member(instance_id),
        assignment=membership.assignment,
    )
    generation = membership.generation

    def follow_membership() -> bool:
        nonlocal generation
        current = _read_membership(member_file)
        if current is not None and current.generation != generation:
            generation = current.generation
            instance.apply_assignment(current.assignment)
        return False  # a replica runs until it is stopped

    _serve(
        instance,
        app,
        out,
        follow_membership,
        tick_seconds=_MEMBERSHIP_POLL_SECONDS,
        prefix=f"[replica {instance_id}] ",
    )
    return instance


def run_cluster_member(
    app: StreamApp,
    log: Log,
    *,
    search_path: list[Path],
    instance_id: str,
    source: ConfigMapMembership,
    out: TextIO = sys.stderr,
) -> StreamsInstance:
    """One pod: start with no tasks, report the layout, follow the operator's membership.

    The pod serves ``/v1/layout`` (and is not ready) before it holds an
    assignment: the operator needs the layout to compute one, and it counts
    a pod as a member once its container runs, never by readiness.
    """
    config = app.streams_config()
    topology = load_topology(app.spec.topology.ref, search_path)
    instance = StreamsInstance(
        topology,
        config,
        log,
        instance_id=instance_id,
        member=Member(instance_id, address=config.application_server),
        assignment=Assignment(active={}, standby={}),  # nothing until the operator says
    )
    generation: int | None = None

    def follow_membership() -> bool:
        nonlocal generation
        current = source.current()
        if current is not None and current.generation != generation:
            generation = current.generation
            instance.apply_assignment(current.assignment)
        return False  # a pod runs until it is stopped

    source.start()
    try:
        _serve(
            instance,
            app,
            out,
            follow_membership,
            tick_seconds=_CLUSTER_TICK_SECONDS,
            prefix=f"[{instance_id}] ",
        )
    finally:
        source.stop()
    return instance


def pod_namespace() -> str:
    """This pod's namespace: POD_NAMESPACE (downward API), else the service account's."""
    namespace = os.environ.get("POD_NAMESPACE")
    if namespace:
        return namespace
    try:
        return (SERVICE_ACCOUNT_DIR / "namespace").read_text(encoding="utf-8").strip()
    except OSError:
        raise EddylineError(
            "cannot tell this pod's namespace: set POD_NAMESPACE (the operator's pods get it "
            "from the downward API)"
        ) from None


def _serve(
    instance: StreamsInstance,
    app: StreamApp,
    out: TextIO,
    finished: Callable[[], bool],
    *,
    tick_seconds: float,
    prefix: str = "",
    timeout: float | None = None,
    on_started: Callable[[StreamsInstance], None] | None = None,
) -> None:
    """Start the instance and its query server; tick until ``finished()`` or a signal;
    close cleanly (final commit) in every case."""
    stop = threading.Event()
    with _stop_on_signals(stop):
        instance.start()
        server = _start_query_server(instance, out)
        if on_started is not None:
            on_started(instance)
        progress = _Progress(instance, out, prefix=prefix)
        deadline = None if timeout is None else time.monotonic() + timeout
        try:
            while not stop.wait(tick_seconds):
                if finished():
                    break
                instance.check()
                progress.maybe_print()
                if deadline is not None and time.monotonic() > deadline:
                    raise TimeoutError(f"{app.metadata.name} still running after {timeout} s")
        finally:
            if server is not None:
                server.stop()
            instance.close()
        progress.print_line(final=True)


def run_group(
    manifest: Path,
    app: StreamApp,
    *,
    config_file: Path | None = None,
    base_port: int | None = None,
    until_caught_up: bool = False,
    logs_dir: Path | None = None,
    timeout: float | None = None,
    out: TextIO = sys.stderr,
) -> None:
    """Supervise ``spec.replicas`` local replicas until SIGINT/SIGTERM, or with
    ``until_caught_up`` until the log holds every input record as committed."""
    group = start_group(
        manifest, app, config_file=config_file, base_port=base_port, logs_dir=logs_dir, out=out
    )
    stop = threading.Event()
    log = open_log(app.spec.log.url)
    deadline = None if timeout is None else time.monotonic() + timeout
    caught_up = False
    with _stop_on_signals(stop):
        try:
            while not stop.wait(0.1):
                for event in group.poll():
                    print(event, file=out, flush=True)
                if until_caught_up and len(group.alive()) == group.replicas:
                    caught_up = not uncommitted_inputs(log, group.layout)
                    if caught_up:
                        break
                if deadline is not None and time.monotonic() > deadline:
                    raise TimeoutError(f"{app.metadata.name} still running after {timeout} s")
        finally:
            log.close()
            codes = group.stop()
            print(f"stopped replicas: {codes}", file=out, flush=True)
    failed = {member: code for member, code in codes.items() if code not in (0, None)}
    if caught_up and failed:
        where = ", ".join(
            f"replica {member} exited with {code}"
            + ("" if group.log_path(member) is None else f" (output: {group.log_path(member)})")
            for member, code in sorted(failed.items())
        )
        raise EddylineError(
            f"{app.metadata.name} caught up, but not every replica closed cleanly: {where}"
        )


def start_group(
    manifest: Path,
    app: StreamApp,
    *,
    config_file: Path | None = None,
    base_port: int | None = None,
    logs_dir: Path | None = None,
    out: TextIO = sys.stderr,
) -> LocalGroup:
    """Start the replicas of ``app`` and print where to query them.

    Replica i answers queries on ``base_port`` + i: by default the port of
    ``application.server`` when it is set, else :data:`DEFAULT_QUERY_PORT`."""
    config = app.streams_config()
    host = "127.0.0.1"
    if base_port is None:
        base_port = DEFAULT_QUERY_PORT
        if config.application_server:
            server = _query_address(config.application_server)
            host, base_port = server.host, server.port
    topology = load_topology(app.spec.topology.ref, [manifest.resolve().parent])
    log = open_log(app.spec.log.url)
    try:
        layout = resolve_topics(topology, config.application_id, log)
    finally:
        log.close()
    group = LocalGroup(
        manifest=manifest.resolve(),
        replicas=app.spec.replicas,
        layout=layout,
        num_standby_replicas=config.num_standby_replicas,
        state_dir=Path(config.state_dir).resolve(),
        zones=app.spec.zones,
        host=host,
        base_port=base_port,
        config_file=config_file,
        logs_dir=logs_dir,
        out=out,
    )
    group.start()
    standbys = min(config.num_standby_replicas, app.spec.replicas - 1)
    capped = (
        f" (num.standby.replicas {config.num_standby_replicas} capped at replicas - 1)"
        if standbys < config.num_standby_replicas
        else ""
    )
    print(
        f"{app.metadata.name}: {app.spec.replicas} replicas, "
        f"{standbys} standby per stateful task{capped}",
        file=out,
    )
    for member in group.members:
        print(
            f"  replica {member.id} ({member.zone}): query http://{member.address}/v1/stores",
            file=out,
        )
    print(
        f"  route a key: eddyline query --bootstrap {group.members[0].address} STORE KEY",
        file=out,
        flush=True,
    )
    return group


def uncommitted_inputs(log: Log, layout: TopicLayout) -> dict[TopicPartition, tuple[int, int]]:
    """(committed, end) of every input partition whose committed offset trails its end.

    Read in sub-topology order: once a sub-topology's inputs are committed, so
    is what it wrote to the repartition topics the next one reads, so a later
    read of those sees it.
    """
    behind: dict[TopicPartition, tuple[int, int]] = {}
    for sub in layout.subtopologies:
        inputs = [
            tp
            for partition in range(layout.partitions[sub.id])
            for tp in layout.input_partitions(TaskId(sub.id, partition))
        ]
        committed = log.committed_offsets(layout.application_id, inputs)
        for tp in inputs:
            end = log.end_offset(tp)
            if committed.get(tp, 0) < end:
                behind[tp] = (committed.get(tp, 0), end)
    return behind


def check_state_dir(state_dir: Path) -> None:
    """Refuse, saying what to fix, a ``state.dir`` that is a file or that we cannot write."""
    if state_dir.exists() and not state_dir.is_dir():
        raise ConfigError(
            "state.dir",
            str(state_dir),
            "a directory",
            hint="it is a file: remove it or choose another state.dir",
        )
    try:
        state_dir.mkdir(parents=True, exist_ok=True)
        probe = state_dir / f".write-probe-{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as error:
        raise ConfigError(
            "state.dir",
            str(state_dir),
            "a directory this process can create and write",
            hint=f"{error.strerror or error}: make it writable by uid {os.getuid()} "
            "(e.g. a volume's fsGroup) or choose another state.dir",
        ) from None


def _read_membership(member_file: Path) -> Membership | None:
    try:
        return Membership.read(member_file)
    except (ValueError, KeyError, TypeError, OSError) as error:
        raise EddylineError(
            f'member file "{member_file}" is not a membership eddyline wrote '
            f"({type(error).__name__}: {error}); start replicas through `eddyline run` "
            "(which writes it), or remove the file"
        ) from None


def _exit_with_supervisor(fd: int, grace_seconds: float = 30.0) -> None:
    """A replica's lifeline: end-of-file on ``fd`` means the supervisor died.

    Then the replica stops as on SIGTERM (commit, close); if that takes more
    than ``grace_seconds`` it exits anyway, releasing its port and locks.
    """

    def watch() -> None:
        try:
            while os.read(fd, 1):
                pass
        except OSError:
            pass
        print("the supervisor is gone: committing and exiting", file=sys.stderr, flush=True)
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(grace_seconds)
        os._exit(1)

    threading.Thread(target=watch, name="eddyline-lifeline", daemon=True).start()


def _wait_for_membership(member_file: Path, instance_id: str, timeout: float = 30.0) -> Membership:
    deadline = time.monotonic() + timeout
    while True:
        membership = _read_membership(member_file)
        if membership is not None and instance_id in membership.assignment.active:
            return membership
        if time.monotonic() > deadline:
            raise EddylineError(
                f"replica {instance_id} is not in {member_file} after {timeout:.0f} s; "
                "start replicas through `eddyline run` (which writes that file)"
            )
        time.sleep(_MEMBERSHIP_POLL_SECONDS)


def _start_query_server(instance: StreamsInstance, out: TextIO) -> QueryServer | None:
    """Serve queries at ``application.server`` when it is set."""
    address = instance.config.application_server
    if not address:
        return None
    host = _query_address(address)
    server = QueryServer(instance, host.host, host.port)
    bound = server.start()
    print(
        f"[replica {instance.instance_id}] queries at http://{bound}/v1/stores",
        file=out,
        flush=True,
    )
    return server


def _query_address(address: str) -> HostInfo:
    try:
        return HostInfo.parse(address)
    except ValueError:
        raise ConfigError("application.server", address, "host:port, e.g. 127.0.0.1:7070") from None


class _Progress:
    """One status line per second: processed records, rate, input lag, commits."""

    def __init__(self, instance: StreamsInstance, out: TextIO, *, prefix: str = "") -> None:
        self._instance = instance
        self._out = out
        self._prefix = prefix
        self._started = time.monotonic()
        self._last_print = self._started
        self._last_processed = 0
        # Replicas share a terminal: no carriage-return updates there.
        self._interactive = out.isatty() and not prefix

    def maybe_print(self) -> None:
        since = time.monotonic() - self._last_print
        busy = self._instance.processed != self._last_processed
        # Idle replicas would only repeat themselves: a line a minute is enough.
        if since >= _PROGRESS_SECONDS and (busy or not self._prefix or since >= 60):
            self.print_line()

    def print_line(self, *, final: bool = False) -> None:
        now = time.monotonic()
        processed = self._instance.processed
        if final:
            rate = processed / max(now - self._started, 1e-9)
        else:
            rate = (processed - self._last_processed) / max(now - self._last_print, 1e-9)
        lags = self._instance.input_lags().values()
        lag = "?" if any(v is None for v in lags) else f"{sum(v or 0 for v in lags):,}"
        # A closed instance's threads no longer register metrics: use their last values.
        metrics = self._instance.final_metrics or self._instance.metrics.snapshot()
        commits = sum(value for name, value in metrics.items() if name.name == "commit-total")
        line = self._prefix + (
            f"processed {processed:,} records ({rate:,.0f}/s), input lag {lag}, "
            f"commits {commits:,.0f}"
        )
        if self._interactive and not final:
            print(f"\r{line}   ", end="", file=self._out, flush=True)
        else:
            print(("\r" if self._interactive else "") + line, file=self._out, flush=True)
        self._last_print, self._last_processed = now, processed


@contextmanager
def _stop_on_signals(stop: threading.Event) -> Iterator[None]:
    """SIGINT and SIGTERM ask for a clean close (only possible on the main thread)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame: FrameType | None) -> None:
        stop.set()

    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)

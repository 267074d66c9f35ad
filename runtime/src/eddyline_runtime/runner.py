"""Run a StreamApp manifest locally: ``eddyline run MANIFEST``.

Loads the manifest (the same pydantic model the operator uses), imports the
topology it names and opens its log. Then, by ``spec.replicas``:

* one replica: one instance runs every task in this process, until
  SIGINT/SIGTERM, or with ``until_caught_up`` until all input is processed
  and committed; it serves interactive queries when ``application.server``
  is set;
* several: a :class:`~eddyline_runtime.local_group.LocalGroup` starts one
  process per replica (each follows the membership file it publishes),
  publishes their assignment, restarts crashed or hung ones, and prints where
  to query them; with ``until_caught_up`` it stops them once all input is
  committed;
* a pod of a cluster (``--membership-configmap``) starts with no tasks,
  reports its layout on ``/v1/layout`` and runs the share of the assignment
  the operator publishes (docs/operator.md). On SIGTERM it is *leaving*: it
  says so in its report and keeps processing (and feeding its standbys) until
  the published membership gives it no active task, or its grace period is
  nearly used up (:func:`~eddyline_runtime.cluster_membership.hand_over_seconds`),
  then commits and exits.

All three start and follow the same way, :func:`run_member`; only the
:class:`~eddyline_runtime.membership.MembershipSource` differs.

"Caught up" always means what the log says: every input and repartition
partition's position (its committed offset, else its beginning) is at its end
offset (:func:`uncommitted_inputs`), never only that an instance has nothing
left to do: an instance fenced out of its tasks holds nothing and would look
done.

Every instance closes cleanly on SIGINT/SIGTERM: a final commit, stores closed (a
leaving pod after its hand-over, once its threads committed and closed the tasks
they lost; a second signal ends the hand-over at once), and only then its query
server stops, so that the tasks' new owners can ask it until its last commit.
"""

from __future__ import annotations

import contextlib
import logging
import os
import select
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import TextIO

from eddyline_runtime.cluster_membership import (
    SERVICE_ACCOUNT_DIR,
    ApiServer,
    ConfigMapMembership,
    hand_over_seconds,
)
from eddyline_runtime.config import StreamsConfig, read_settings_file
from eddyline_runtime.engine.instance import StreamsInstance
from eddyline_runtime.engine.queryable import HostInfo
from eddyline_runtime.engine.topics import TopicLayout, resolve_topics
from eddyline_runtime.errors import ConfigError, EddylineError
from eddyline_runtime.local_group import LocalGroup
from eddyline_runtime.log import Log, open_log
from eddyline_runtime.log.positions import read_positions
from eddyline_runtime.membership import MembershipFile, MembershipSource, SoleMember
from eddyline_runtime.partitions import TaskId, TopicPartition
from eddyline_runtime.processing.loader import load_topology
from eddyline_runtime.query.server import QueryServer
from eddyline_runtime.spec import StreamApp, load_manifest

logger = logging.getLogger(__name__)

_PROGRESS_SECONDS = 1.0
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
    """The manifest, with ``config_file`` (``.properties`` or YAML) over its ``spec.config``,
    validated once; the environment (``EDDYLINE_<NAME>``) overrides both when the process
    builds its config (:meth:`StreamApp.streams_config`)."""
    if manifest.is_dir():
        raise EddylineError(
            f'manifest "{manifest}" is a directory; pass the StreamApp YAML file in it '
            f"(e.g. {manifest / 'streamapp.yaml'})"
        )
    app = load_manifest(manifest)
    if config_file is not None:
        settings = {**app.spec.config, **read_settings_file(config_file)}
        app = app.with_config(settings, source=str(config_file))
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
    # This process's settings, built once (the environment over the manifest) and handed on.
    config = app.streams_config()
    if member_file is None and membership_configmap is None:
        capped = standby_cap_warning(app.spec.replicas, config.num_standby_replicas)
        if capped is not None:
            logger.warning(capped)
    if member_file is None and membership_configmap is None and app.spec.replicas > 1:
        run_group(
            manifest,
            app,
            config=config,
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
        source: MembershipSource
        hand_over: HandOver | None = None
        if membership_configmap is not None:
            configmap = ConfigMapMembership(
                ApiServer.from_environment(), namespace=pod_namespace(), name=membership_configmap
            )
            source, prefix = configmap, f"[{instance_id}] "
            # A pod hands its tasks over before it exits (a local replica's supervisor
            # reassigns them itself when it stops one); with the ConfigMap deleted (the
            # app is being deleted) nobody will take them: it exits at once.
            hand_over = HandOver(hand_over_seconds(), lambda: configmap.gone)
        elif member_file is not None:
            source, prefix = MembershipFile(member_file), f"[replica {instance_id}] "
        else:
            return run_app(
                app,
                log,
                config=config,
                search_path=[manifest.resolve().parent],
                instance_id=instance_id,
                until_caught_up=until_caught_up,
                timeout=timeout,
                out=out,
                on_started=on_started,
            )
        return run_member(
            app,
            log,
            source,
            config=config,
            search_path=[manifest.resolve().parent],
            instance_id=instance_id,
            out=out,
            prefix=prefix,
            hand_over=hand_over,
        )
    finally:
        log.close()


def run_app(
    app: StreamApp,
    log: Log,
    *,
    config: StreamsConfig | None = None,
    search_path: list[Path],
    instance_id: str = "0",
    until_caught_up: bool = False,
    timeout: float | None = None,
    out: TextIO = sys.stderr,
    on_started: Callable[[StreamsInstance], None] | None = None,
) -> StreamsInstance:
    """A single process running every task, until stopped (or caught up). ``config``:
    this process's settings (default: :meth:`StreamApp.streams_config`)."""
    config = app.streams_config() if config is None else config
    application_id = config.application_id

    def finished(instance: StreamsInstance) -> bool:
        if not until_caught_up:
            return False
        fenced = sum(thread.migrated for thread in instance.threads)
        if fenced:
            raise EddylineError(
                f"{fenced} task(s) of instance {instance_id} were taken over by another "
                f'instance of application "{application_id}" (it fenced this one\'s '
                "transactions), so this run cannot finish its input; stop the other instance "
                "(eddyline run with spec.replicas > 1 runs several safely) and run again"
            )
        return (
            instance.caught_up()
            and instance.layout is not None
            and not uncommitted_inputs(log, instance.layout)
        )

    return run_member(
        app,
        log,
        SoleMember(),
        config=config,
        search_path=search_path,
        instance_id=instance_id,
        out=out,
        finished=finished,
        timeout=timeout,
        on_started=on_started,
    )


def run_member(
    app: StreamApp,
    log: Log,
    membership_source: MembershipSource,
    *,
    config: StreamsConfig | None = None,
    search_path: list[Path],
    instance_id: str = "0",
    out: TextIO = sys.stderr,
    prefix: str = "",
    finished: Callable[[StreamsInstance], bool] | None = None,
    timeout: float | None = None,
    on_started: Callable[[StreamsInstance], None] | None = None,
    hand_over: HandOver | None = None,
) -> StreamsInstance:
    """Every member's start-up: load the topology, check state.dir, start from the
    source's membership and act on each new generation it publishes, until
    SIGINT/SIGTERM or ``finished(instance)``.

    With ``hand_over`` a signal makes the member *leaving* instead: it goes on until
    the membership gives it no active task, for at most ``hand_over.seconds``.

    A pod starts with no tasks: it serves ``/v1/layout`` (and is not ready)
    before it holds an assignment, as the operator needs the layout to compute
    one and counts a pod as a member once its container runs, never by readiness.
    """
    config = app.streams_config() if config is None else config
    topology = load_topology(app.spec.topology.ref, search_path)
    check_state_dir(Path(config.state_dir))
    first = membership_source.start(instance_id)
    try:
        instance = StreamsInstance(
            topology,
            config,
            log,
            instance_id=instance_id,
            assignment=None if first is None else first.assignment,
        )
        generation = None if first is None else first.generation

        def follow_membership() -> bool:
            nonlocal generation
            current = membership_source.current()
            if current is not None and current.generation != generation:
                generation = current.generation
                instance.apply_assignment(current.assignment)
            return finished is not None and finished(instance)

        _serve(
            instance,
            app,
            out,
            follow_membership,
            tick_seconds=membership_source.poll_seconds,
            prefix=prefix,
            timeout=timeout,
            on_started=on_started,
            hand_over=hand_over,
        )
    finally:
        membership_source.stop()
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
    hand_over: HandOver | None = None,
) -> None:
    """Start the instance and its query server; tick until ``finished()`` or a signal
    (with ``hand_over``: until the hand-over after a signal, :class:`_Leaving`); close
    cleanly (final commit) in every case."""
    with _stop_signals() as signalled:
        instance.start()
        server = _start_query_server(instance, out)
        if on_started is not None:
            on_started(instance)
        progress = _Progress(instance, out, prefix=prefix)
        deadline = None if timeout is None else time.monotonic() + timeout
        leaving: _Leaving | None = None
        try:
            while True:
                if signalled(tick_seconds):
                    if hand_over is None or leaving is not None:
                        break  # no hand-over here, or a second signal: close now
                    leaving = _Leaving(instance, hand_over, out, prefix)
                if finished() or (leaving is not None and leaving.done()):
                    break
                instance.check()
                progress.maybe_print()
                if deadline is not None and time.monotonic() > deadline:
                    raise TimeoutError(f"{app.metadata.name} still running after {timeout} s")
        finally:
            # The final commits first, then the query server: a task's new owner asks this
            # member's /v1/layout until it no longer names the task (engine/task_release.py),
            # so the layout must answer until every commit is made and readable; an
            # unreachable member is taken for one that is gone for good.
            try:
                instance.close()
            finally:
                if server is not None:
                    server.stop()
        progress.print_line(final=True)


@dataclass(frozen=True)
class HandOver:
    """How a cluster member leaves on SIGTERM: for at most ``seconds`` (its grace period
    less the final commit's margin), and not at all once ``authority_gone()`` (the
    membership's publisher is gone, so nobody will take its tasks over)."""

    seconds: float
    authority_gone: Callable[[], bool] = lambda: False


class _Leaving:
    """A member on its way out: it processes on until the published membership gives it
    no active task (its tasks were handed over to caught-up copies), or until the hand-over's
    time is up."""

    def __init__(
        self, instance: StreamsInstance, hand_over: HandOver, out: TextIO, prefix: str
    ) -> None:
        self.instance = instance
        self.hand_over = hand_over
        self.started = time.monotonic()
        self.deadline = self.started + hand_over.seconds
        self.out, self.prefix = out, prefix
        instance.leaving = True
        print(
            f"{prefix}leaving: handing tasks over before exiting "
            f"(at most {hand_over.seconds:.0f} s)",
            file=out,
            flush=True,
        )

    def done(self) -> bool:
        waited = time.monotonic() - self.started
        if self.hand_over.authority_gone():
            print(
                f"{self.prefix}the membership is gone (the app is being deleted): "
                "committing and exiting",
                file=self.out,
                flush=True,
            )
            return True
        if self.instance.handed_over():
            print(
                f"{self.prefix}tasks handed over after {waited:.1f} s (committed and closed): "
                "exiting",
                file=self.out,
                flush=True,
            )
            return True
        if time.monotonic() >= self.deadline:
            print(
                f"{self.prefix}hand-over not done after {waited:.0f} s (the grace period is "
                "nearly used up): committing and exiting; the tasks still here move as a "
                "lost member's do",
                file=self.out,
                flush=True,
            )
            return True
        return False


def run_group(
    manifest: Path,
    app: StreamApp,
    *,
    config: StreamsConfig | None = None,
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
        manifest,
        app,
        config=config,
        config_file=config_file,
        base_port=base_port,
        logs_dir=logs_dir,
        out=out,
    )
    log = open_log(app.spec.log.url)
    deadline = None if timeout is None else time.monotonic() + timeout
    caught_up = False
    with _stop_signals() as signalled:
        try:
            while not signalled(0.1):
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
    config: StreamsConfig | None = None,
    config_file: Path | None = None,
    base_port: int | None = None,
    logs_dir: Path | None = None,
    out: TextIO = sys.stderr,
) -> LocalGroup:
    """Start the replicas of ``app`` and print where to query them.

    Replica i answers queries on ``base_port`` + i: by default the port of
    ``application.server`` when it is set, else :data:`DEFAULT_QUERY_PORT`."""
    config = app.streams_config() if config is None else config
    host = "127.0.0.1"
    if base_port is None:
        base_port = DEFAULT_QUERY_PORT
        if config.application_server:
            server = _query_address(config.application_server)
            host, base_port = server.host, server.port
    topology = load_topology(app.spec.topology.ref, [manifest.resolve().parent])
    log = open_log(app.spec.log.url)
    try:
        layout = resolve_topics(
            topology,
            config.application_id,
            log,
            window_changelog_additional_retention_ms=(
                config.windowstore_changelog_additional_retention_ms
            ),
            dead_letter_queue_topic=config.errors_dead_letter_queue_topic_name,
        )
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
        acceptable_recovery_lag=config.acceptable_recovery_lag,
        max_warmup_replicas=config.max_warmup_replicas,
        probing_rebalance_interval_ms=config.probing_rebalance_interval_ms,
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
    """(position, end) of every input partition whose position trails its end.

    The position is where the application reads next (:func:`read_positions`:
    the committed offset, else the partition's beginning), so a partition
    truncated past what was ever committed is caught up once its remaining
    records are. Read in sub-topology order: once a sub-topology's inputs are
    committed, so is what it wrote to the repartition topics the next one
    reads, so a later read of those sees it.
    """
    behind: dict[TopicPartition, tuple[int, int]] = {}
    for sub in layout.subtopologies:
        inputs = [
            tp
            for partition in range(layout.partitions[sub.id])
            for tp in layout.input_partitions(TaskId(sub.id, partition))
        ]
        positions = read_positions(log, layout.application_id, inputs)
        for tp in inputs:
            end = log.end_offset(tp)
            if positions[tp] < end:
                behind[tp] = (positions[tp], end)
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
        try:
            print("the supervisor is gone: committing and exiting", file=sys.stderr, flush=True)
        except OSError:
            # Our output went to the dead supervisor's pipe: every write now raises
            # BrokenPipeError (this one once ended the thread before the SIGTERM
            # below, and replicas outlived a SIGKILLed supervisor). Nobody reads
            # it any more, so let the shutdown write to /dev/null instead.
            _discard_output()
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(grace_seconds)
        os._exit(1)

    threading.Thread(target=watch, name="eddyline-lifeline", daemon=True).start()


def _discard_output() -> None:
    """Point this process's stdout and stderr at /dev/null (their reader is gone)."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    os.dup2(devnull, 1)
    os.dup2(devnull, 2)
    os.close(devnull)


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
def _stop_signals() -> Iterator[Callable[[float], bool]]:
    """``arrived(seconds)``: whether SIGINT or SIGTERM came since the last call, waiting at
    most ``seconds`` for one (only the main thread can take signals; elsewhere it only
    waits).

    The handler writes a byte to a pipe and takes no lock. It runs on the main thread
    between two bytecodes, wherever that thread is: a ``threading.Event.set()`` there
    deadlocked when the signal landed while the main thread held that Event's own lock
    inside ``Event.wait()`` (the lock is not reentrant). The pod then never began its
    hand-over and its kubelet SIGKILLed it at the end of the grace period (exit 137, now and
    then in the tests; a loop of such waits SIGTERMed 100 times hung once)."""
    if threading.current_thread() is not threading.main_thread():

        def waited(seconds: float) -> bool:
            time.sleep(seconds)
            return False

        yield waited
        return
    read_end, write_end = os.pipe()
    os.set_blocking(read_end, False)
    os.set_blocking(write_end, False)

    def handler(signum: int, frame: FrameType | None) -> None:
        with contextlib.suppress(BlockingIOError):  # a full pipe already says "arrived"
            os.write(write_end, b"!")

    # poll, not select: a pod holds many descriptors (stores' files, sockets), and select
    # refuses one numbered past FD_SETSIZE (1024).
    poller = select.poll()
    poller.register(read_end, select.POLLIN)

    def arrived(seconds: float) -> bool:
        # A signal during the poll runs the handler, whose byte ends the poll (PEP 475).
        poller.poll(seconds * 1000)
        came = False
        with contextlib.suppress(BlockingIOError):
            while os.read(read_end, 256):  # several signals at once count as one
                came = True
        return came

    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield arrived
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)
        os.close(read_end)
        os.close(write_end)

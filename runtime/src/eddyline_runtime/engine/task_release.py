"""Cooperative hand-over: a moved task's new owner waits for the old one to release it.

When a new assignment moves a stateful task T from member L to this member S,
both act on it independently. Promoting S's standby (or warm-up) copy at once
would make S replay whatever L committed since the copy last read its
changelog (a restore on the critical path), and S's producer, opened before
L's final commit lands, would fence that commit so L's last work is redone.
Kafka Streams avoids both with cooperative rebalancing (KIP-429): a task is
revoked from its old owner, which commits and closes it, before it is given to
the new one. Here it is done pod to pod, with no round trip through the
membership authority:

* S keeps T as a standby (its copy keeps replaying and answering stale
  queries) while L's ``/v1/layout`` still reports T's stores active or
  restoring. L drops T from that report only after its final commit of T (the
  stream thread commits the tasks it loses before it closes them, and a closed
  task leaves its thread's task map only then);
* once L no longer runs T, S waits for its copy to read T's changelogs to
  their end (one more replay round), then promotes it: nothing to restore;
* S stops asking L when L cannot be reached (refused or timed out: a pod that
  exited after handing over, or crashed; it commits nothing more either way, as
  a pod's query server stops only after its final commits, runner.py)
  and only lets its copy finish reading;
* a newer assignment without L (L left the membership, typically a drained pod)
  does not end the hold either: L may still be making its final commit of T,
  so S goes on asking L as before (it answers until it exits, then counts as
  unreachable) and lets its copy read that commit. Promoting at once made the
  copy replay it (issue 38).

"Caught up" means the copy read its changelogs to an end read *after the old
owner was fenced* (instance.py ``_fence_previous_owners``, then
``_copy_caught_up``). The catch-up invariant: **the end a copy is compared with before
its promotion holds every record any earlier owner of the task can ever
commit.** The release signal alone cannot give that: it is another process's
word, read over HTTP, about a commit whose markers land later (a Kafka commit
returns before its markers reach the changelog, so an end read then is below
the commit's records), and nothing in the log stops an owner from committing
again after it said it let go. Opening a producer for the task's
transactional id does: on Kafka ``InitProducerId`` returns only once every
earlier transaction of that id is complete (markers written; an open one is
aborted) and from then on the old producer's commits fail. So the watcher
fences first, then reads the end; the copy replays up to it as a standby, and
the promotion's own producer (which fences again) finds nothing more to
restore. Fencing an owner that released is free (it writes nothing more);
fencing one that had not really let go makes it drop the task uncommitted
(``TaskMigratedError``), its work redone here: exactly-once either way.
Under at-least-once there are no transactions to fence or wait for, and the
end is read after the release as before. A copy must be open to be caught up:
one its stream thread has yet to open (the assignment that gave it is posted,
or being applied) is waited for like one still reading; only a copy waiting
for a Spark build has nothing to wait for (issue 38's soak: a task moved away
and back within a second was promoted before its copy opened, and restored 7
records). Issue 38: the scale-in e2e once saw
a copy judged caught up in the same round as the release (55 ms) and its
promotion then replayed 12 records.

The invariant: a task is never processed by two members at once in a way that
publishes twice, and a member never waits forever for a dead owner. The first
is the log's fencing (exactly-once: S's producer fences L's, whose later
commits fail), never the wait; the wait only spares S a replay. The second is
two bounds: while L answers and reports T running it is still processing T
(its output keeps flowing, nothing stalls), so S waits for it up to
``RELEASE_HOLD_LIMIT_SECONDS`` (inside a pod's termination grace: past it L is
stuck); once L let T go (released, unreachable or left), S's copy gets
``RELEASE_WAIT_SECONDS`` from then to catch up. Past either, S promotes
anyway and fencing handles L as before.

The waiting is done by a small watcher thread; the instance hands each stream
thread its share with the held tasks as standbys, and again without them once
released (the thread promotes a standby in place).
"""

from __future__ import annotations

import json
import logging
import threading
import time
import urllib.error
import urllib.request
from collections import Counter, deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from eddyline_runtime.assignor import Assignment
from eddyline_runtime.engine.assignment_inbox import (
    RELEASE_HOLD_LIMIT_SECONDS,
    RELEASE_WAIT_SECONDS,
)
from eddyline_runtime.membership import MemberReport, StoreRole
from eddyline_runtime.partitions import TaskId

logger = logging.getLogger(__name__)

# How often the watcher asks the old owners: a release is seen within this.
_POLL_SECONDS = 0.05
# One layout request at most this long (a pod that does not answer in a second is treated as
# gone: a live one answers in milliseconds, its layout is a memory read).
_REQUEST_TIMEOUT_SECONDS = 1.0
# Outcomes kept for inspection (tests, a debugger); the metrics count all of them.
_OUTCOMES_KEPT = 256
# The copies of a task its owner reports while it runs it.
_RUNNING_ROLES = frozenset({StoreRole.ACTIVE, StoreRole.RESTORING})

# Asks a member (by its query address) which tasks it runs actively, within a timeout;
# None when it cannot be reached.
LayoutProbe = Callable[[str, float], frozenset[TaskId] | None]


def running_tasks(report: MemberReport) -> frozenset[TaskId]:
    """The tasks whose stores ``report`` names active or restoring."""
    return report.tasks_with(lambda copy: copy.role in _RUNNING_ROLES)


def probe_layout(address: str, timeout: float) -> frozenset[TaskId] | None:
    """The tasks the member at ``address`` (``host:port`` of its query server) runs, from its
    ``GET /v1/layout``; None when it refuses, times out or answers something else."""
    base = address if "://" in address else f"http://{address}"
    try:
        with urllib.request.urlopen(base.rstrip("/") + "/v1/layout", timeout=timeout) as response:
            return running_tasks(MemberReport.from_json(json.load(response)))
    except urllib.error.HTTPError as error:
        if error.code == 503:
            return frozenset()  # it has not started its instance: it runs nothing
        return None
    except (OSError, ValueError):  # refused, timed out, reset, not a layout
        return None


@dataclass(frozen=True, slots=True)
class ReleaseOutcome:
    """How one held task ended: ``how`` is released, unreachable, bound (a bound reached)
    or dropped (no longer moving here)."""

    task: TaskId
    owner: str
    how: str
    waited_seconds: float


@dataclass(slots=True)
class _Held:
    owner: str
    address: str
    since: float
    released_at: float | None = None
    unreachable: bool = False
    fenced: bool = False


class TaskRelease:
    """The tasks this member holds back until their previous owner released them."""

    def __init__(
        self,
        member_id: str,
        *,
        caught_up: Callable[[TaskId], bool],
        deliver: Callable[[], None],
        fence: Callable[[Sequence[TaskId]], Mapping[TaskId, Exception]] = lambda tasks: {},
        probe: LayoutProbe = probe_layout,
        wait_seconds: float = RELEASE_WAIT_SECONDS,
        limit_seconds: float = RELEASE_HOLD_LIMIT_SECONDS,
        poll_seconds: float = _POLL_SECONDS,
    ) -> None:
        """``caught_up(task)``: this member's copy of ``task`` read its changelogs to their
        end; ``deliver()``: hand the threads the assignment again (some task was let go);
        ``fence(tasks)``: make sure no earlier owner of each task can commit anything more
        (called once the old owner let it go, before ``caught_up``; see the module), for
        every task a round found let go at once, so their round trips overlap; it returns
        the tasks it could not fence, each with its error.
        ``wait_seconds``: the copy's time to catch up once the old owner let the task go;
        ``limit_seconds``: the longest hold in all (an old owner still reporting it). The
        callables are called from the watcher thread, never under this object's lock."""
        self.member_id = member_id
        self._caught_up = caught_up
        self._deliver = deliver
        self._fence = fence
        self._probe = probe
        self._wait_seconds = wait_seconds
        self._limit_seconds = limit_seconds
        self._poll_seconds = poll_seconds
        self._lock = threading.Lock()
        self._held: dict[TaskId, _Held] = {}
        self._watcher: threading.Thread | None = None
        self._stop = threading.Event()
        # The latest outcomes (a bounded record: a pod lives through many rebalances), and
        # counts by how each ended, for the metrics.
        self.outcomes: deque[ReleaseOutcome] = deque(maxlen=_OUTCOMES_KEPT)
        self.counts: Counter[str] = Counter()

    def held(self) -> frozenset[TaskId]:
        with self._lock:
            return frozenset(self._held)

    def hold(self, previous: Assignment | None, assignment: Assignment) -> frozenset[TaskId]:
        """The tasks of ``assignment`` to keep as standbys for now: those moving here from a
        member that is still in ``assignment``, whose copy this member kept (a standby or a
        warm-up in ``previous``); holds of earlier assignments go on while the task is still
        this member's, also when its old owner left the membership meanwhile (it may still be
        making its final commit: the watcher asks it until it answers no more)."""
        me = self.member_id
        mine = assignment.active.get(me, frozenset())
        now = time.monotonic()
        with self._lock:
            kept: dict[TaskId, _Held] = {}
            for task, held in self._held.items():
                if task in mine:
                    kept[task] = held
                else:
                    self._ended(task, held, "dropped", now)
            if previous is not None and me in previous.active:
                copies = previous.standby[me] | previous.warmup[me]
                for task in sorted(mine - kept.keys()):
                    if task not in copies or task not in previous.tasks:
                        continue
                    owner = previous.active_owner(task)
                    if owner == me or owner not in assignment.active:
                        continue
                    address = assignment.member(owner).address
                    if address is None:
                        continue  # nobody to ask: promote as before
                    kept[task] = _Held(owner, address, now)
                    logger.info(
                        "task %s moves here from %s: kept as a standby until %s releases it "
                        "(at most %.1f s)",
                        task,
                        owner,
                        owner,
                        self._limit_seconds,
                    )
            self._held = kept
            if kept and (self._watcher is None or not self._watcher.is_alive()):
                self._watcher = threading.Thread(
                    target=self._watch, name=f"eddyline-task-release-{me}", daemon=True
                )
                self._watcher.start()
            return frozenset(kept)

    def close(self) -> None:
        self._stop.set()
        watcher = self._watcher
        if watcher is not None and watcher is not threading.current_thread():
            watcher.join(_REQUEST_TIMEOUT_SECONDS + 1)

    # -- the watcher ----------------------------------------------------------------

    def _watch(self) -> None:
        while not self._stop.is_set():
            with self._lock:
                if not self._held:
                    self._watcher = None
                    return
                held = dict(self._held)
            try:
                let_go = self._round(held)
            except Exception as error:  # a log call failed: ask again (the bounds still hold)
                logger.warning("task release: checking %s failed: %s", sorted(held), error)
                let_go = {}
            if let_go:
                with self._lock:
                    now = time.monotonic()
                    for task, how in let_go.items():
                        current = self._held.get(task)
                        if current is held[task]:  # not replaced by a newer hold meanwhile
                            del self._held[task]
                            self._ended(task, current, how, now)
                self._deliver()
            self._stop.wait(self._poll_seconds)

    def _round(self, held: dict[TaskId, _Held]) -> dict[TaskId, str]:
        """One look at every held task; returns those to let go and why."""
        let_go: dict[TaskId, str] = {}
        answers: dict[str, frozenset[TaskId] | None] = {}
        released: list[TaskId] = []
        for task, entry in sorted(held.items()):
            now = time.monotonic()
            left = self._limit_seconds - (now - entry.since)
            if left <= 0:
                let_go[task] = "bound"  # an owner stuck with it, or a copy that never got there
                continue
            if entry.released_at is None:
                if entry.address not in answers:
                    timeout = min(_REQUEST_TIMEOUT_SECONDS, left)
                    answers[entry.address] = self._probe(entry.address, timeout)
                running = answers[entry.address]
                if running is not None and task in running:
                    # Still processing it: its output keeps flowing, so waiting (past
                    # wait_seconds if need be) stalls nothing and spares a replay here.
                    continue
                entry.released_at = time.monotonic()
                entry.unreachable = running is None
            released.append(task)
        # Released, or its owner gone: first make sure it can commit nothing more (the end
        # read below must hold its last commit, whatever its word was; see the module
        # docstring), then, once the copy read to that end, promote with nothing to
        # restore. A copy slow to get there is promoted at the bound. Every task let go
        # in this round is fenced in one call: a rebalance moving many tasks off one
        # member costs one round trip, not one per task.
        unfenced = [task for task in released if not held[task].fenced]
        failed: Mapping[TaskId, Exception] = {}
        if unfenced:
            try:
                failed = self._fence(unfenced)
            except Exception as error:  # every one of them: tried again next round
                failed = dict.fromkeys(unfenced, error)
        for task in released:
            entry = held[task]
            released_at = entry.released_at
            assert released_at is not None  # set in the loop above
            if task in failed:
                logger.warning("task %s: fencing %s failed: %s", task, entry.owner, failed[task])
                if time.monotonic() - released_at >= self._wait_seconds:
                    let_go[task] = "bound"  # the promotion's own producer fences it
                continue
            entry.fenced = True
            if self._caught_up(task):
                let_go[task] = "unreachable" if entry.unreachable else "released"
            elif time.monotonic() - released_at >= self._wait_seconds:
                let_go[task] = "bound"
        return let_go

    def _ended(self, task: TaskId, held: _Held, how: str, now: float) -> None:
        waited = now - held.since
        self.outcomes.append(ReleaseOutcome(task, held.owner, how, waited))
        self.counts[how] += 1
        if how == "released":
            released = (held.released_at or now) - held.since
            logger.info(
                "task %s released by %s after %.0f ms; copy caught up after %.0f ms: promoting",
                task,
                held.owner,
                released * 1000,
                waited * 1000,
            )
        elif how == "bound":
            if held.released_at is None:
                logger.warning(
                    "task %s: %s did not release it within %.1f s; promoting anyway (its "
                    "final commit may be fenced and redone here)",
                    task,
                    held.owner,
                    waited,
                )
            else:
                logger.warning(
                    "task %s: the copy did not catch up within %.1f s of %s letting it go; "
                    "promoting anyway (it restores the rest)",
                    task,
                    now - held.released_at,
                    held.owner,
                )
        elif how == "unreachable":
            logger.info(
                "task %s: %s cannot be reached (gone); copy caught up after %.0f ms: promoting",
                task,
                held.owner,
                waited * 1000,
            )
        else:
            logger.info(
                "task %s: no longer held for %s (no longer moving here) after %.0f ms",
                task,
                held.owner,
                waited * 1000,
            )

"""What an instance reports about itself to the membership authority (``GET /v1/layout``).

On a cluster the operator computes the assignment but never imports the
user's topology (it lives in the app's image). So each pod reports the task
layout it resolved against the log (sub-topologies x partitions, which are
stateful, a hash of ``describe()``) and the role, lag, bytes on disk and staleness
(``as_of_ms``/``staleness_ms``, query/staleness.py) of every store partition it
holds: the operator assigns from that, and reads standby lags and readiness from
it for status and for rolling restarts; a query router picks, for a query with
``max_staleness_ms``, the copies reported within the bound (query/client.py).
"""

from __future__ import annotations

from eddyline_runtime.engine.instance import InstanceNotStartedError, StreamsInstance
from eddyline_runtime.membership import GlobalStoreCopy, MemberReport, StoreCopy, StoreRole
from eddyline_runtime.processing.description import describe_hash
from eddyline_runtime.query.staleness import copy_freshness, is_fresh
from eddyline_runtime.restore.replay.lag import wall_clock_ms


def topology_hash(text: str) -> str:
    """A short, stable fingerprint of a topology's ``describe()`` (``eddyline describe
    --hash`` prints the same)."""
    return describe_hash(text)


def member_report(instance: StreamsInstance) -> MemberReport:
    """The instance's layout and store copies; raises InstanceNotStartedError before start."""
    layout = instance.layout
    if layout is None:
        raise InstanceNotStartedError(
            "the instance has not resolved its topics yet (it is starting); retry shortly"
        )
    stores: dict[str, dict[int, StoreCopy]] = {}
    # One instant for the whole report: its copies' staleness compare with one another.
    now = wall_clock_ms()
    for store in instance.topology.stores:
        for local in instance.local_store_partitions(store):
            role = local.role
            if role is StoreRole.ACTIVE and not local.running:
                role = StoreRole.RESTORING
            freshness = copy_freshness(local, fresh=is_fresh(instance, local), now_ms=now)
            stores.setdefault(store, {})[local.partition] = StoreCopy(
                role,
                local.lag.offset_lag,
                local.disk_bytes(),
                as_of_ms=freshness.as_of_ms,
                staleness_ms=freshness.staleness_ms,
                reports_staleness=True,
            )
    for pending in instance.restore_pending():
        # Not opened yet: the lag is the whole changelog a replay would read, which is what
        # the operator compares with spec.restore's threshold before launching a build.
        stores.setdefault(pending.store, {})[pending.changelog.partition] = StoreCopy(
            StoreRole.RESTORE_PENDING, pending.records
        )
    return MemberReport(
        member=instance.member.id,
        topology_hash=topology_hash(instance.topology.describe()),
        tasks=frozenset(layout.tasks()),
        stateful=frozenset(layout.stateful_tasks()),
        stores=stores,
        ready=instance.ready(),
        store_owners={
            name: sub.id for sub in instance.topology.subtopologies() for name in sub.stores
        },
        stores_set_aside=tuple(str(path) for path in instance.stores_set_aside),
        leaving=instance.leaving,
        global_stores={
            name: GlobalStoreCopy(
                spec.topic,
                instance.global_stores.bootstrapped.is_set(),
                sum(lag.offset_lag for lag in instance.global_stores.lags(name).values()),
            )
            for name, spec in instance.topology.global_stores.items()
        },
        generated_names=tuple(instance.topology.generated_names()),
        internal_topics=tuple(instance.topology.internal_topics),
    )

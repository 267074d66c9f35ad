"""Where a topology's topics live in the log, and how many partitions each task group has.

Before any task starts, the runtime resolves the topology against the log:

* a sub-topology has as many tasks as its input topics have partitions (the
  largest count when it reads several; stateful ones need equal counts,
  i.e. co-partitioned inputs, as Kafka Streams requires for joins);
* internal topics (repartition topics) are named ``<application.id>-<name>``
  and get the partition count of the sub-topology that writes them;
* each logged store has a compacted changelog ``<application.id>-<store>-changelog``
  with one partition per task of its sub-topology; a window or session
  store's changelog also gets ``retention.ms`` (cleanup ``compact,delete``): the store's retention
  plus ``windowstore.changelog.additional.retention.ms``, as Kafka Streams sets it; a
  key-value store's gets the ``retention.ms`` its ``Materialized.with_logging_enabled``
  configs give (with ``cleanup.policy=compact,delete``, the only policy that takes one);
* output topics that do not exist yet are created with the partition count of
  the sub-topology that writes them. Input topics must exist: the user's data
  cannot be guessed, so a missing one is an error naming the way out.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from eddyline_runtime.config import (
    DEFAULT_WINDOW_CHANGELOG_ADDITIONAL_RETENTION_MS as _ADDITIONAL_RETENTION_MS,
)
from eddyline_runtime.errors import EddylineError
from eddyline_runtime.log import Log, TopicSpec
from eddyline_runtime.partitions import TaskId, TopicPartition
from eddyline_runtime.processing.topology import SubTopology, Topology
from eddyline_runtime.state.relocation import StoreHomes
from eddyline_runtime.state.window_layout import changelog_retention_ms


class TopologyLayoutError(EddylineError):
    """The topology does not fit the topics in the log (missing or mismatched topics)."""


@dataclass(frozen=True)
class TopicLayout:
    """The topology resolved against the log: physical topics and task counts."""

    application_id: str
    # Topic names as the topology writes them -> topics in the log.
    physical: Mapping[str, str]
    # Sub-topology id -> its number of tasks (partitions).
    partitions: Mapping[int, int]
    # Store name -> its changelog topic (absent for stores without a changelog).
    changelogs: Mapping[str, str]
    # Every topic the topology touches -> its partition count.
    topic_partitions: Mapping[str, int]
    subtopologies: tuple[SubTopology, ...]

    def tasks(self) -> list[TaskId]:
        return [
            TaskId(sub.id, partition)
            for sub in self.subtopologies
            for partition in range(self.partitions[sub.id])
        ]

    def stateful_tasks(self) -> set[TaskId]:
        """Tasks with at least one store that has a changelog (those get standbys)."""
        return {
            task
            for task in self.tasks()
            if any(store in self.changelogs for store in self.subtopology(task).stores)
        }

    def subtopology(self, task: TaskId) -> SubTopology:
        return self.subtopologies[task.subtopology]

    def input_partitions(self, task: TaskId) -> list[TopicPartition]:
        """The log partitions a task reads (an input with fewer partitions may have none)."""
        sub = self.subtopology(task)
        return [
            TopicPartition(self.physical[topic], task.partition)
            for topic in sub.source_topics
            if task.partition < self.topic_partitions[self.physical[topic]]
        ]

    def changelog_partition(self, store: str, task: TaskId) -> TopicPartition | None:
        topic = self.changelogs.get(store)
        return None if topic is None else TopicPartition(topic, task.partition)


def resolve_topics(
    topology: Topology,
    application_id: str,
    log: Log,
    *,
    window_changelog_additional_retention_ms: int = _ADDITIONAL_RETENTION_MS,
    dead_letter_queue_topic: str | None = None,
) -> TopicLayout:
    """Create the internal, changelog and missing output topics; return the layout.

    ``dead_letter_queue_topic`` (``errors.dead.letter.queue.topic.name``) must
    exist already: as Kafka Streams, the app never creates it (KIP-1034)."""
    subtopologies = tuple(topology.subtopologies())
    internal = set(topology.internal_topics)
    physical = physical_topics(topology, application_id, subtopologies)
    existing = dict(log.topics())
    counts, reader_counts = _partition_counts(subtopologies, physical, internal, existing, log.url)
    if dead_letter_queue_topic is not None:
        if dead_letter_queue_topic not in existing:
            raise TopologyLayoutError(
                f'the dead-letter topic "{dead_letter_queue_topic}" '
                "(errors.dead.letter.queue.topic.name) does not exist in the log "
                f"{log.url}; the app does not create it (as Kafka Streams): create it "
                f"first (eddyline log --log {log.url} create-topic {dead_letter_queue_topic} "
                "--partitions N), or unset the setting"
            )
        physical = {**physical, dead_letter_queue_topic: dead_letter_queue_topic}

    # Each topic's partition count as read or created here, never listed again afterwards: a
    # Kafka cluster's metadata is eventually consistent (a topic another member created a
    # moment ago may be missing from the next listing), and a topic missing from the layout
    # fails the stream thread at its first output to it.
    topic_partitions = {name: spec.partitions for name, spec in existing.items()}
    writer_of = {topic: sub for sub in subtopologies for topic in sub.sink_topics}
    for topic, sub in writer_of.items():
        name = physical[topic]
        if name not in existing:
            partitions = reader_counts.get(topic, counts[sub.id])
            topic_partitions[name] = log.create_topic(name, partitions).partitions
    changelogs = changelog_topics(topology, application_id, subtopologies)
    for sub in subtopologies:
        for store in sub.stores:
            if store not in changelogs:
                continue
            spec = topology.stores[store]
            created = log.create_topic(changelogs[store], counts[sub.id], compacted=True)
            topic_partitions[changelogs[store]] = created.partitions
            if spec.retention_ms is not None:
                log.set_topic_retention(
                    changelogs[store],
                    changelog_retention_ms(
                        spec.retention_ms, window_changelog_additional_retention_ms
                    ),
                )
            elif "retention.ms" in (configs := dict(spec.changelog_configs)):
                # A key-value store's compact,delete changelog (checked when the
                # topology was built: retention.ms comes with that policy only).
                log.set_topic_retention(changelogs[store], int(configs["retention.ms"]))
    return TopicLayout(
        application_id=application_id,
        physical=physical,
        partitions=counts,
        changelogs=changelogs,
        topic_partitions=topic_partitions,
        subtopologies=subtopologies,
    )


def physical_topics(
    topology: Topology, application_id: str, subtopologies: tuple[SubTopology, ...]
) -> dict[str, str]:
    """Topic names as the topology writes them -> topics in the log: internal topics
    (repartition topics) are prefixed with the application.id, the others are the user's."""
    internal = set(topology.internal_topics)
    return {
        topic: f"{application_id}-{topic}" if topic in internal else topic
        for sub in subtopologies
        for topic in (*sub.source_topics, *sub.sink_topics)
    }


def changelog_topics(
    topology: Topology, application_id: str, subtopologies: tuple[SubTopology, ...]
) -> dict[str, str]:
    """Store -> its changelog topic, for every store with logging on."""
    return {
        store: topology.stores[store].changelog_topic(application_id)
        for sub in subtopologies
        for store in sub.stores
        if topology.stores[store].logged
    }


def single_partition_layout(
    topology: Topology, application_id: str, dead_letter_queue_topic: str | None = None
) -> TopicLayout:
    """The layout of a run without a log (:mod:`eddyline_runtime.testing`): every topic
    named as :func:`resolve_topics` names it, with one partition, and nothing created."""
    subtopologies = tuple(topology.subtopologies())
    physical = physical_topics(topology, application_id, subtopologies)
    if dead_letter_queue_topic is not None:
        physical[dead_letter_queue_topic] = dead_letter_queue_topic
    changelogs = changelog_topics(topology, application_id, subtopologies)
    return TopicLayout(
        application_id=application_id,
        physical=physical,
        partitions=dict.fromkeys((sub.id for sub in subtopologies), 1),
        changelogs=changelogs,
        topic_partitions=dict.fromkeys([*physical.values(), *changelogs.values()], 1),
        subtopologies=subtopologies,
    )


def _partition_counts(
    subtopologies: tuple[SubTopology, ...],
    physical: Mapping[str, str],
    internal: set[str],
    existing: Mapping[str, TopicSpec],
    log_url: str,
) -> tuple[dict[int, int], dict[str, int]]:
    """Each sub-topology's partition count, and the internal topics that take their
    reader's count rather than their writer's (see the cycle below)."""
    missing = sorted(
        physical[topic]
        for sub in subtopologies
        for topic in sub.source_topics
        if topic not in internal and physical[topic] not in existing
    )
    if missing:
        raise TopologyLayoutError(
            f"input topic(s) {', '.join(missing)} do not exist in the log {log_url}; create "
            f"them first: eddyline log --log {log_url} create-topic NAME --partitions N"
        )
    writer_of = {topic: sub.id for sub in subtopologies for topic in sub.sink_topics}
    counts: dict[int, int] = {}
    reader_counts: dict[str, int] = {}

    def known(topic: str) -> int | None:
        if topic not in internal:
            return existing[physical[topic]].partitions
        if topic in reader_counts:
            return reader_counts[topic]
        writer = writer_of.get(topic)
        return None if writer is None else counts.get(writer)

    # Internal topics take their writer's count, so resolve writers first. A foreign-key
    # join's two sub-topologies write each other's inputs (a cycle): once no writer can be
    # resolved first, every blocked sub-topology reading a topic of known count takes that
    # count at once, and the internal topics it reads from unresolved writers are
    # co-partitioned with it, as Kafka co-partitions the subscription and response topics
    # with their readers' tables.
    while len(counts) < len(subtopologies):
        decided: dict[int, tuple[int, list[str]]] = {}
        for cycle in (False, True):
            for sub in subtopologies:
                if sub.id in counts or sub.id in decided:
                    continue
                sizes = {topic: known(topic) for topic in sub.source_topics}
                resolved = {topic: n for topic, n in sizes.items() if n is not None}
                if not resolved or (len(resolved) < len(sizes) and not cycle):
                    continue
                if any(t not in resolved and t not in writer_of for t in sizes):
                    continue  # an input nothing writes: refused below
                if sub.stores and len(set(resolved.values())) > 1:
                    listed = ", ".join(f"{physical[t]} ({n})" for t, n in resolved.items())
                    raise TopologyLayoutError(
                        f"sub-topology {sub.id} joins topics with different partition counts: "
                        f"{listed}; stateful sub-topologies need co-partitioned inputs (same "
                        "key, same number of partitions): repartition one side or recreate it"
                    )
                decided[sub.id] = (max(resolved.values()), [t for t in sizes if t not in resolved])
                if not cycle:
                    counts[sub.id] = decided[sub.id][0]  # may resolve the next by its writer
            if decided:
                break
        if not decided:
            unresolved = [sub.id for sub in subtopologies if sub.id not in counts]
            raise TopologyLayoutError(
                f"sub-topologies {unresolved} read internal topics nothing writes"
            )
        for sub_id, (count, followers) in decided.items():
            counts[sub_id] = count
            reader_counts.update(dict.fromkeys(followers, count))
    return counts, reader_counts


def store_homes(topology: Topology, layout: TopicLayout | None = None) -> StoreHomes:
    """Which sub-topology owns each persistent store now, and why other names have none.

    What KIP-816 relocation needs of a topology, in terms ``state``
    understands; with the topology resolved against the log (``layout``),
    also which tasks exist, so nothing is moved into a task that does not.
    """
    owners = {
        name: sub.id
        for sub in topology.subtopologies()
        for name in sub.stores
        if topology.stores[name].persistent
    }
    homeless = {
        name: (
            "the topology keeps this store in memory now"
            if not spec.persistent
            else "no processor of the topology uses this store"
        )
        for name, spec in topology.stores.items()
        if name not in owners
    }
    # A global store has no task: its copy lives in state.dir/global/<store>, read from
    # its topic; a task's directory holding that name is an older topology's, left alone.
    homeless.update(
        {
            name: "it is a global store now: every instance keeps it in state.dir/global/"
            f"{name}, read from its topic; relocation never moves a store into or out of it"
            for name in topology.global_stores
        }
    )
    unlogged = frozenset(name for name in owners if not topology.stores[name].logged)
    return StoreHomes(
        owners,
        homeless,
        None if layout is None else frozenset(layout.tasks()),
        unlogged=unlogged,
    )

"""Foreign-key table-table joins (KIP-213): what ``KTable.join(other, foreign_key_extractor,
joiner)`` and ``left_join`` run, with Kafka Streams' protocol and semantics.

The left table's value names a key of the right table, so the two tables are not
co-partitioned: each left row *subscribes* to its foreign key in the right table's
partition, and the right side *responds* to the left row's partition::

    left table ──send──> <name>-subscription-registration-topic (keyed by foreign key)
                              │
    right table ──┐          receive (subscription store: foreign key | left key)
                  │           │
                  │          subscription join: the right table's row ──┐
                  └─ foreign join: prefix scan of the store ────────────┴─> response topic
                                                                 (keyed by left key)
                                                                          │
    left table's store <── response resolver: drop if the hash is stale, else joiner(left, right)

* **send** (Kafka's ``SubscriptionSendProcessorSupplier``, with KAFKA-16407's fix of
  foreign keys changing from or to None): on each left change it sends a
  :class:`Subscription` to the new foreign key, and, when the key changed, one to the
  old key that removes the left row there. The instruction says what the right side
  answers (:class:`Instruction`, Kafka's byte values). A null foreign key subscribes
  nowhere: an inner join drops the update (logged and counted; an old key's result
  is unset); a left join sends it keyless, so the right side answers "no match".
* **receive** keeps the subscription (or deletes it) in the subscription store, keyed
  ``len(fk) | fk | left key`` so the right side finds every subscriber of a foreign
  key by one prefix scan (Kafka's ``CombinedKeySchema``).
* **subscription join** answers a subscription with the right table's current row.
* **foreign join**: each update of a right row answers every subscriber of its key
  (the fan-out), a tombstone with a null right value.
* **response resolver** (Kafka's ``ResponseJoinProcessorSupplier``): a response
  carries the hash of the left value it answers; if the left row has changed since
  (another response is on its way), the response is stale and dropped (counted);
  else it emits ``joiner(left, right)``, or a tombstone when there is no right row
  (inner join) or no left row (both).

The hash is a 128-bit BLAKE2b of the left value serialized with the left table's
value serde (Kafka uses Murmur3-128: the same role, another function; the bytes on
the internal topics are eddyline's own, see :func:`encode_subscription`). Every
store is a task store (transactional, changelogged), and both internal topics are
written in the task's transaction, so under exactly-once a crash neither loses nor
repeats a subscription or a response.
"""

from __future__ import annotations

import enum
import hashlib
import logging
import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final, NamedTuple

from eddyline_runtime.key_ranges import KeyRange
from eddyline_runtime.processing.joins import ValueJoiner
from eddyline_runtime.processing.operators.stores import (
    KeyValueStore,
    TimestampedKeyValueStore,
    is_versioned,
    key_value_store,
    versioned_store,
)
from eddyline_runtime.processing.operators.tables import as_change
from eddyline_runtime.processing.topology import Processor, ProcessorContext
from eddyline_runtime.serde import SerdeError, serde_for
from eddyline_runtime.value_and_timestamp import split_timestamped

logger = logging.getLogger(__name__)

# The wire version of both wrappers; a newer one is refused (a rolling upgrade must not
# let an old instance misread a format it does not know), as Kafka's wrappers do.
VERSION: Final = 1
_HASH_BYTES: Final = 16  # 128 bits, as Kafka's Murmur3.hash128
_NO_HASH: Final = 0x80  # flag bit of the version byte: the left value was a tombstone
_NO_VALUE: Final = 0x40  # flag bit of a response's version byte: no right value
_VERSION_MASK: Final = 0x3F
_PARTITION: Final = struct.Struct(">i")
_LENGTH: Final = struct.Struct(">I")


class Instruction(enum.IntEnum):
    """What the right side does with a subscription (Kafka's ``SubscriptionWrapper.Instruction``,
    with its byte values)."""

    # Remove the subscription; answer nothing (the left row moved to another key).
    DELETE_KEY_NO_PROPAGATE = 0
    # Remove the subscription; answer "no right value" (the left row is gone).
    DELETE_KEY_AND_PROPAGATE = 1
    # Subscribe; answer the right row, or "no right value" (the result must be unset).
    PROPAGATE_NULL_IF_NO_FK_VAL_AVAILABLE = 2
    # Subscribe; answer only if the right row exists (a new left row: nothing to unset).
    PROPAGATE_ONLY_IF_FK_VAL_AVAILABLE = 3


class Subscription(NamedTuple):
    """A left row's subscription (Kafka's ``SubscriptionWrapper``): the hash of its value
    (None for a tombstone), the instruction, its key as the left key serde wrote it,
    and the partition it came from."""

    hash: bytes | None
    instruction: Instruction
    left_key: bytes
    partition: int


class Response(NamedTuple):
    """The right side's answer (Kafka's ``SubscriptionResponseWrapper``): the hash of the
    left value it answers and the right value as its serde wrote it (None: no row)."""

    hash: bytes | None
    right_value: bytes | None
    partition: int


class ForeignKeyJoinFormatError(SerdeError):
    """Bytes on a foreign-key join's internal topic or store that this version cannot read."""


def value_hash(data: bytes | None) -> bytes | None:
    """The hash a subscription carries of the left value's bytes (None: no value)."""
    return None if data is None else hashlib.blake2b(data, digest_size=_HASH_BYTES).digest()


def _version_byte(flags: int, data: bytes, what: str) -> int:
    if not data:
        raise ForeignKeyJoinFormatError(f"an empty {what}: the internal topic holds no wrapper")
    version = data[0] & _VERSION_MASK
    if version > VERSION:
        raise ForeignKeyJoinFormatError(
            f"a {what} of version {version}, newer than this eddyline's {VERSION}: an instance "
            "of a newer version wrote it; finish the rolling upgrade before running this one"
        )
    return data[0] & flags


def encode_subscription(subscription: Subscription) -> bytes:
    """``version|flags, instruction, [hash], partition, left key`` (the key last: its length
    is the rest)."""
    flags = VERSION | (_NO_HASH if subscription.hash is None else 0)
    return b"".join(
        (
            bytes((flags, subscription.instruction)),
            subscription.hash or b"",
            _PARTITION.pack(subscription.partition),
            subscription.left_key,
        )
    )


def decode_subscription(data: bytes) -> Subscription:
    no_hash = _version_byte(_NO_HASH, data, "subscription")
    offset = 2
    hashed = None
    if not no_hash:
        hashed, offset = data[offset : offset + _HASH_BYTES], offset + _HASH_BYTES
    (partition,) = _PARTITION.unpack_from(data, offset)
    return Subscription(hashed, Instruction(data[1]), data[offset + _PARTITION.size :], partition)


def encode_response(response: Response) -> bytes:
    """``version|flags, [hash], partition, [right value]``."""
    flags = VERSION | (_NO_HASH if response.hash is None else 0)
    flags |= _NO_VALUE if response.right_value is None else 0
    return b"".join(
        (
            bytes((flags,)),
            response.hash or b"",
            _PARTITION.pack(response.partition),
            response.right_value or b"",
        )
    )


def decode_response(data: bytes) -> Response:
    flags = _version_byte(_NO_HASH | _NO_VALUE, data, "subscription response")
    offset = 1
    hashed = None
    if not flags & _NO_HASH:
        hashed, offset = data[offset : offset + _HASH_BYTES], offset + _HASH_BYTES
    (partition,) = _PARTITION.unpack_from(data, offset)
    offset += _PARTITION.size
    return Response(hashed, None if flags & _NO_VALUE else data[offset:], partition)


def subscription_prefix(foreign_key: bytes) -> bytes:
    """The subscription store's keys of one foreign key start so (Kafka's ``CombinedKeySchema``:
    the length first, so one key's prefix never matches a longer key's)."""
    return _LENGTH.pack(len(foreign_key)) + foreign_key


@dataclass(frozen=True)
class ForeignKeyJoin:
    """A foreign-key join's description, shared by its five processors.

    ``left_store``/``right_store`` hold the two tables (a key-value or versioned store
    each); ``subscription_store`` the subscriptions of left rows by foreign key.
    Serdes are the tables': the left key and value (the value hashed), the right
    key (the foreign key: it keys the registration topic, so the right table's
    partitioner must agree with it) and value.
    """

    foreign_key_extractor: Callable[[Any], Any]
    joiner: ValueJoiner
    left: bool
    left_store: str
    right_store: str
    subscription_store: str
    left_key_serde: str | None
    left_value_serde: str | None
    right_key_serde: str | None
    right_value_serde: str | None


def _skip(context: ProcessorContext, what: str) -> None:
    logger.warning(
        "Skipping record due to null %s. topic=[%s] partition=[%d] offset=[%d]",
        what,
        context.topic,
        context.partition,
        context.offset,
    )
    context.record_dropped()


class _CurrentValue:
    """A table's current row by key bytes, from its key-value or versioned store (Kafka's
    ``KTableValueGetter``): ``(timestamp or None, value bytes)`` or None."""

    def __init__(self, context: ProcessorContext, store: str) -> None:
        if is_versioned(context, store):
            self._versioned = versioned_store(context, store)
            self._plain: KeyValueStore | None = None
        else:
            self._plain = key_value_store(context, store)

    def get(self, key: bytes) -> tuple[int | None, bytes] | None:
        if self._plain is not None:
            stored = self._plain.get(key)
            # A table's store keeps no timestamps: the result takes the record's.
            return None if stored is None else (None, stored)
        record = self._versioned.get(key)
        return None if record is None else (record.timestamp, record.value)


class SubscriptionSendProcessor(Processor):
    """The left side: a left change becomes subscriptions keyed by foreign key."""

    def __init__(self, spec: ForeignKeyJoin) -> None:
        self._spec = spec
        self._left_keys: Any = serde_for(spec.left_key_serde)
        self._left_values: Any = serde_for(spec.left_value_serde)
        self._foreign_keys: Any = serde_for(spec.right_key_serde)

    def process(self, key: Any, value: Any) -> None:
        if key is None:
            _skip(self.context, "key")
            return
        change = as_change(value)
        new, old = change.new, change.old
        extract = self._spec.foreign_key_extractor
        new_fk = None if new is None else extract(new)
        old_fk = None if old is None else extract(old)
        hashed = value_hash(None if new is None else self._left_values.serialize(new))
        left_key = self._left_keys.serialize(key)
        send: list[tuple[Any, Instruction]] = []
        # Kafka's leftJoinInstructions / defaultJoinInstructions (as of KAFKA-16407 and
        # its follow-up: a foreign key may change from or to None), case by case.
        unsubscribe = old_fk is not None
        if self._spec.left:
            if old is None and new is None:
                return  # an idempotent delete: nothing to answer
            if unsubscribe and not self._same(new_fk, old_fk):
                # The new subscription goes elsewhere; only its answer is wanted.
                send.append((old_fk, Instruction.DELETE_KEY_NO_PROPAGATE))
            # Always an answer, a delete's too: sent keyless when the new key is None.
            send.append((new_fk, Instruction.PROPAGATE_NULL_IF_NO_FK_VAL_AVAILABLE))
        elif new is None:
            if unsubscribe:
                send.append((old_fk, Instruction.DELETE_KEY_AND_PROPAGATE))
        elif new_fk is None:
            _skip(self.context, "foreign key")
            if unsubscribe:  # unset the old key's result (if it had one)
                send.append((old_fk, Instruction.DELETE_KEY_AND_PROPAGATE))
        elif unsubscribe and not self._same(new_fk, old_fk):
            send.append((old_fk, Instruction.DELETE_KEY_NO_PROPAGATE))
            # "No match" too: the old key's result must be unset.
            send.append((new_fk, Instruction.PROPAGATE_NULL_IF_NO_FK_VAL_AVAILABLE))
        else:
            # An insert, or the same key: no earlier result to unset if there is no match.
            send.append((new_fk, Instruction.PROPAGATE_ONLY_IF_FK_VAL_AVAILABLE))
        partition = self.context.partition
        for foreign_key, instruction in send:
            wrapper = Subscription(hashed, instruction, left_key, partition)
            self.context.forward(foreign_key, encode_subscription(wrapper))

    def _same(self, a: Any, b: Any) -> bool:
        """Foreign keys compare by their bytes, as the registration topic sees them."""
        return bool(self._foreign_keys.serialize(a) == self._foreign_keys.serialize(b))


class _Subscribed(NamedTuple):
    """What receive passes to the subscription join: the foreign key (None: a keyless
    left-join subscription) and the subscription, with its record's timestamp."""

    foreign_key: bytes | None
    subscription: Subscription


class SubscriptionReceiveProcessor(Processor):
    """The right side's entry: keeps or removes the subscription, then passes it on."""

    def __init__(self, spec: ForeignKeyJoin) -> None:
        self._spec = spec
        self._foreign_keys: Any = serde_for(spec.right_key_serde)

    def init(self, context: ProcessorContext) -> None:
        super().init(context)
        self._store = TimestampedKeyValueStore(
            key_value_store(context, self._spec.subscription_store)
        )

    def process(self, key: Any, value: Any) -> None:
        subscription = decode_subscription(value)
        if key is None:
            if subscription.instruction != Instruction.PROPAGATE_NULL_IF_NO_FK_VAL_AVAILABLE:
                _skip(self.context, "foreign key")
                return
            self.context.forward(None, _Subscribed(None, subscription))
            return
        foreign_key = self._foreign_keys.serialize(key)
        stored_key = subscription_prefix(foreign_key) + subscription.left_key
        if subscription.instruction in (
            Instruction.DELETE_KEY_AND_PROPAGATE,
            Instruction.DELETE_KEY_NO_PROPAGATE,
        ):
            self._store.delete(stored_key)
        else:
            self._store.put(stored_key, value, self.context.timestamp)
        self.context.forward(key, _Subscribed(foreign_key, subscription))


class SubscriptionJoinProcessor(Processor):
    """Answers a subscription with the right table's current row for its foreign key."""

    def __init__(self, spec: ForeignKeyJoin) -> None:
        self._spec = spec

    def init(self, context: ProcessorContext) -> None:
        super().init(context)
        self._right = _CurrentValue(context, self._spec.right_store)

    def process(self, key: Any, value: Any) -> None:
        subscribed: _Subscribed = value
        subscription = subscribed.subscription
        found = None if subscribed.foreign_key is None else self._right.get(subscribed.foreign_key)
        timestamp = self.context.timestamp
        if found is not None and found[0] is not None:
            timestamp = max(timestamp, found[0])
        right_value = None if found is None else found[1]
        instruction = subscription.instruction
        if instruction == Instruction.DELETE_KEY_NO_PROPAGATE:
            return
        if instruction == Instruction.DELETE_KEY_AND_PROPAGATE:
            right_value = None
        elif instruction == Instruction.PROPAGATE_ONLY_IF_FK_VAL_AVAILABLE and found is None:
            return
        response = Response(subscription.hash, right_value, subscription.partition)
        self.context.forward(subscription.left_key, encode_response(response), timestamp=timestamp)


class ForeignTableJoinProcessor(Processor):
    """A right row's update answers every left row subscribed to its key (the fan-out)."""

    def __init__(self, spec: ForeignKeyJoin) -> None:
        self._spec = spec
        self._foreign_keys: Any = serde_for(spec.right_key_serde)
        self._right_values: Any = serde_for(spec.right_value_serde)

    def init(self, context: ProcessorContext) -> None:
        super().init(context)
        self._store = key_value_store(context, self._spec.subscription_store)

    def process(self, key: Any, value: Any) -> None:
        if key is None:
            _skip(self.context, "key")
            return
        new = as_change(value).new
        right_value = None if new is None else self._right_values.serialize(new)
        prefix = subscription_prefix(self._foreign_keys.serialize(key))
        for _, stored in self._store.scan(KeyRange.prefix(prefix)):
            subscription = decode_subscription(split_timestamped(stored)[1])
            response = Response(subscription.hash, right_value, subscription.partition)
            self.context.forward(subscription.left_key, encode_response(response))


class ResponseResolverProcessor(Processor):
    """The left side again: a response for the left row's current value becomes the
    join's result; one for a value the row no longer has is dropped."""

    def __init__(self, spec: ForeignKeyJoin) -> None:
        self._spec = spec
        self._left_keys: Any = serde_for(spec.left_key_serde)
        self._left_values: Any = serde_for(spec.left_value_serde)
        self._right_values: Any = serde_for(spec.right_value_serde)

    def init(self, context: ProcessorContext) -> None:
        super().init(context)
        self._left = _CurrentValue(context, self._spec.left_store)

    def process(self, key: Any, value: Any) -> None:
        response = decode_response(value)
        found = self._left.get(self._left_keys.serialize(key))
        current = None if found is None else found[1]
        if response.hash != value_hash(current):
            # Stale: the left row changed after this subscription; its newer one answers.
            logger.debug("Dropping FK-join response due to hash mismatch for key %r", key)
            self.context.record_dropped()
            return
        right = (
            None if response.right_value is None
            else self._right_values.deserialize(response.right_value)
        )  # fmt: skip
        if right is None and (not self._spec.left or current is None):
            self.context.forward(key, None)  # no result (any more): a tombstone
            return
        left = None if current is None else self._left_values.deserialize(current)
        self.context.forward(key, self._spec.joiner(left, right))

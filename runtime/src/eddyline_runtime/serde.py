"""Serdes: how keys and values become the bytes stores and logs hold.

Built-in serdes match Kafka's wire formats so data stays readable by Kafka
tools: strings are UTF-8, ``int`` is Kafka's IntegerSerde (4 bytes,
big-endian, signed), ``long`` its LongSerde (8 bytes), JSON is UTF-8 JSON.
``None`` always maps to ``None`` (a tombstone). A user serde is any object
with ``serialize`` and ``deserialize``, named in config as ``module:attribute``.

The runtime converts whole batches with :func:`serialize_all` and
:func:`deserialize_all`: built-in serdes convert a list in one C-level pass
(``map`` over ``str.encode``, ``struct.pack``, ...) instead of a Python call
per record; a list holding ``None`` or a value the fast path refuses goes
through the per-value methods, which raise the usual :class:`SerdeError`.
A user serde may offer ``serialize_all``/``deserialize_all`` too.
"""

from __future__ import annotations

import json
import re
import struct
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Generic, Protocol, TypeVar

from eddyline_runtime.errors import ConfigError, EddylineError, one_of
from eddyline_runtime.references import Reference, ReferenceLoadError, load_reference

T = TypeVar("T")


class SerdeError(EddylineError, ValueError):
    """A value that a serde cannot turn into bytes, or bytes it cannot read."""


class Serde(Protocol[T]):
    def serialize(self, value: T | None) -> bytes | None: ...

    def deserialize(self, data: bytes | None) -> T | None: ...


class BytesSerde:
    def serialize(self, value: bytes | None) -> bytes | None:
        return value

    def deserialize(self, data: bytes | None) -> bytes | None:
        return data

    def serialize_all(self, values: Sequence[Any]) -> list[bytes | None]:
        return list(values)

    def deserialize_all(self, data: Sequence[bytes | None]) -> list[bytes | None]:
        return list(data)


class StringSerde:
    def serialize(self, value: str | None) -> bytes | None:
        return None if value is None else value.encode()

    def deserialize(self, data: bytes | None) -> str | None:
        if data is None:
            return None
        try:
            return data.decode()
        except UnicodeDecodeError as exc:
            raise SerdeError(f"bytes {data[:32]!r} are not UTF-8 text ({exc.reason})") from None

    def serialize_all(self, values: Sequence[Any]) -> list[bytes | None]:
        try:
            return list(map(str.encode, values))
        except TypeError:  # a None (or a non-str, which serialize reports)
            return [self.serialize(value) for value in values]

    def deserialize_all(self, data: Sequence[bytes | None]) -> list[str | None]:
        try:
            return list(map(bytes.decode, data))  # type: ignore[arg-type]
        except (TypeError, UnicodeDecodeError):
            return [self.deserialize(item) for item in data]


class _FixedIntSerde(Generic[T]):
    def __init__(self, layout: struct.Struct, name: str) -> None:
        self._layout = layout
        self._name = name

    def serialize(self, value: int | None) -> bytes | None:
        if value is None:
            return None
        try:
            return self._layout.pack(value)
        except struct.error:
            raise SerdeError(f"{value!r} does not fit a {self._name}") from None

    def deserialize(self, data: bytes | None) -> int | None:
        if data is None:
            return None
        if len(data) != self._layout.size:
            raise SerdeError(
                f"a {self._name} is {self._layout.size} bytes, got {len(data)}: {data[:32]!r}"
            )
        value: int = self._layout.unpack(data)[0]
        return value

    def serialize_all(self, values: Sequence[Any]) -> list[bytes | None]:
        try:
            return list(map(self._layout.pack, values))
        except struct.error:  # a None, or a value that does not fit: say which
            return [self.serialize(value) for value in values]

    def deserialize_all(self, data: Sequence[bytes | None]) -> list[int | None]:
        try:
            return [unpacked for (unpacked,) in map(self._layout.unpack, data)]  # type: ignore[arg-type]
        except (struct.error, TypeError):
            return [self.deserialize(item) for item in data]


IntSerde = _FixedIntSerde[int](struct.Struct(">i"), "4-byte int")
LongSerde = _FixedIntSerde[int](struct.Struct(">q"), "8-byte long")


class JsonSerde:
    def serialize(self, value: Any) -> bytes | None:
        if value is None:
            return None
        try:
            return json.dumps(value, separators=(",", ":"), sort_keys=True).encode()
        except (TypeError, ValueError) as exc:
            raise SerdeError(f"{value!r} is not JSON-serializable ({exc})") from None

    def deserialize(self, data: bytes | None) -> Any:
        if data is None:
            return None
        try:
            return json.loads(data)
        except ValueError as exc:
            raise SerdeError(f"bytes {data[:32]!r} are not JSON ({exc})") from None


BUILT_IN: dict[str, Any] = {
    "bytes": BytesSerde(),
    "string": StringSerde(),
    "int": IntSerde,
    "long": LongSerde,
    "json": JsonSerde(),
}


def serialize_all(serde: Any, values: Sequence[Any]) -> list[bytes | None]:
    """``[serde.serialize(v) for v in values]``, in one pass where the serde offers one."""
    batch = getattr(serde, "serialize_all", None)
    if batch is not None:
        return list(batch(values))
    return [serde.serialize(value) for value in values]


def deserialize_all(serde: Any, data: Sequence[bytes | None]) -> list[Any]:
    """``[serde.deserialize(d) for d in data]``, in one pass where the serde offers one."""
    batch = getattr(serde, "deserialize_all", None)
    if batch is not None:
        return list(batch(data))
    return [serde.deserialize(item) for item in data]


# Serdes built around another one, named ``<kind>(<arguments>)`` (the windowed keys'
# ``time-windowed(string,60000)``): each kind's factory takes the argument text and
# returns the serde. They are registered by the module owning the types the serde
# makes (processing.windows for Windowed keys), which this leaf module cannot import;
# a topology using one has imported that module to build itself.
_WRAPPED: dict[str, Callable[[str, str], Any]] = {}
_WRAPPED_NAME = re.compile(r"([a-z][a-z-]*)\((.*)\)")


def register_wrapped_serde(kind: str, factory: Callable[[str, str], Any]) -> None:
    """Make ``<kind>(<arguments>)`` a serde name: ``factory(arguments, key)`` builds the
    serde (and raises ``ConfigError`` for setting ``key`` when the arguments are wrong)."""
    _WRAPPED[kind] = factory


def serde_for(name: str | None, *, key: str = "serde") -> Any:
    """A built-in serde by name, a wrapping one as ``<kind>(<arguments>)`` (see
    :func:`register_wrapped_serde`), a user serde as ``module:attribute``; None passes
    bytes."""
    if name is None:
        return BUILT_IN["bytes"]
    if name in BUILT_IN:
        return BUILT_IN[name]
    wrapped = _WRAPPED_NAME.fullmatch(name)
    if wrapped is not None:
        factory = _WRAPPED.get(wrapped[1])
        if factory is None:
            raise ConfigError(
                key, name, f"a wrapping serde of kind {one_of(_WRAPPED) or '(none registered)'}"
            )
        return factory(wrapped[2], key)
    accepted = f"{one_of(BUILT_IN)} or a user serde as 'module:attribute'"
    if Reference.parse(name) is None:
        raise ConfigError(key, name, accepted)
    try:
        found = load_reference(name)
    except ReferenceLoadError as exc:
        raise ConfigError(key, name, accepted, hint=f"could not load it: {exc.detail}") from None
    serde = found() if isinstance(found, type) else found
    if not (hasattr(serde, "serialize") and hasattr(serde, "deserialize")):
        raise ConfigError(key, name, accepted, hint="it has no serialize/deserialize methods")
    return serde


def serde_for_request(name: str, *, own: Iterable[str | None], key: str = "serde") -> Any:
    """A serde a query request names: a built-in one or one the store itself uses.

    Requests come from the network, so they never get :func:`serde_for`'s
    ``module:attribute`` loading, which imports a module and calls a class
    (``subprocess:Popen`` would run ``Popen()``). A store's own serdes came
    from its topology, which the operator deployed, so naming them is safe.
    """
    accepted = [*BUILT_IN, *sorted({n for n in own if n is not None and n not in BUILT_IN})]
    if name not in accepted:
        raise ConfigError(
            key, name, one_of(accepted), hint="a query names a built-in serde or the store's own"
        )
    return serde_for(name, key=key)

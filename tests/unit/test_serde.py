"""Serdes: Kafka-compatible bytes, tombstones, and errors that say what was wrong."""

from __future__ import annotations

from typing import Any

import pytest

from eddyline_runtime.errors import ConfigError
from eddyline_runtime.serde import SerdeError, deserialize_all, serde_for, serialize_all


@pytest.mark.parametrize(
    ("name", "value", "encoded"),
    [
        ("bytes", b"\x00\xff", b"\x00\xff"),
        ("string", "grüße", "grüße".encode()),
        ("int", -2, b"\xff\xff\xff\xfe"),  # Kafka's IntegerSerializer
        ("long", 1, b"\x00" * 7 + b"\x01"),
        ("json", {"b": [1, 2], "a": None}, b'{"a":null,"b":[1,2]}'),
    ],
)
def test_built_in_serdes_round_trip_in_kafka_formats(
    name: str, value: object, encoded: bytes
) -> None:
    serde = serde_for(name)
    assert serde.serialize(value) == encoded
    assert serde.deserialize(encoded) == value
    assert serde.serialize(None) is None
    assert serde.deserialize(None) is None


def test_bad_input_is_named() -> None:
    with pytest.raises(SerdeError, match="does not fit a 4-byte int"):
        serde_for("int").serialize(2**31)
    with pytest.raises(SerdeError, match="a 8-byte long is 8 bytes, got 3"):
        serde_for("long").deserialize(b"abc")
    with pytest.raises(SerdeError, match="not UTF-8"):
        serde_for("string").deserialize(b"\xff")


def test_user_serdes_load_by_module_and_attribute() -> None:
    assert serde_for("eddyline_runtime.serde:StringSerde").serialize("x") == b"x"
    with pytest.raises(ConfigError) as error:
        serde_for("avro")
    assert "'bytes', 'string', 'int', 'long', 'json'" in str(error.value)
    with pytest.raises(ConfigError, match="could not load it"):
        serde_for("no_such_module:Serde")


def test_a_request_may_name_built_in_serdes_and_the_stores_own() -> None:
    from eddyline_runtime.serde import serde_for_request

    assert serde_for_request("long", own=("string", "long")) is serde_for("long")
    assert serde_for_request("json", own=(None,)) is serde_for("json")


@pytest.mark.parametrize(
    "name", ["subprocess:Popen", "os:system", "eddyline_runtime.serde:JsonSerde"]
)
def test_a_request_naming_code_is_refused_without_importing_it(name: str) -> None:
    from eddyline_runtime.serde import serde_for_request

    with pytest.raises(ConfigError) as raised:
        serde_for_request(name, own=("string", "long"), key="value_serde")
    message = str(raised.value)
    assert '"value_serde"' in message and repr(name) in message
    assert "'bytes', 'string', 'int', 'long', 'json'" in message


def test_a_stores_own_user_serde_may_be_named_by_a_request() -> None:
    from eddyline_runtime.serde import serde_for_request

    serde = serde_for_request(
        "eddyline_runtime.serde:JsonSerde", own=("eddyline_runtime.serde:JsonSerde",)
    )
    assert serde.deserialize(b"[1]") == [1]


@pytest.mark.parametrize(
    ("name", "values"),
    [
        ("bytes", [b"a", None, b""]),
        ("string", ["a", None, "ünï"]),
        ("int", [1, None, -(2**31)]),
        ("long", [2**40, None, -1]),
        ("json", [{"a": [1]}, None, "x"]),
        ("eddyline_runtime.serde:StringSerde", ["no", "batch", None]),
    ],
)
def test_lists_convert_as_their_values_do(name: str, values: list[Any]) -> None:
    serde = serde_for(name)
    for sample in (values, [v for v in values if v is not None], []):
        encoded = serialize_all(serde, sample)
        assert encoded == [serde.serialize(v) for v in sample]
        assert deserialize_all(serde, encoded) == sample


def test_a_bad_value_in_a_list_is_named_as_alone() -> None:
    with pytest.raises(SerdeError, match="does not fit a 4-byte int"):
        serialize_all(serde_for("int"), [1, 2**31])
    with pytest.raises(SerdeError, match="a 8-byte long is 8 bytes, got 3"):
        deserialize_all(serde_for("long"), [b"\0" * 8, b"abc"])
    with pytest.raises(SerdeError, match="not UTF-8"):
        deserialize_all(serde_for("string"), [b"ok", b"\xff"])

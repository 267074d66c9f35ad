"""``spec.config."rocksdb.memory.limit.share"``: a cluster may set the share of a pod's memory
limit its RocksDB stores use (docs/operator.md, "Bounded memory"); the CRD takes a number in
(0, 1] and refuses anything else naming the key and the accepted values, and the operator's
model refuses the same values, so a client that skips the CRD's validation is refused too.
The real API server runs the same rule in tests/e2e/test_operator_chart_monitoring.py."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from eddyline_operator.crd import generate_crd
from eddyline_operator.reconcile.plan import parse_app
from eddyline_runtime.config import StreamsConfig
from eddyline_runtime.spec import ManifestError
from tests.support.crd_schema import admit

KEY = "rocksdb.memory.limit.share"
GOOD: dict[str, Any] = {
    "apiVersion": "eddyline.dev/v1alpha1",
    "kind": "StreamApp",
    "metadata": {"name": "wc", "namespace": "apps"},
    "spec": {"topology": {"ref": "wordcount:topology"}, "log": {"url": "kafka://k:9092"}},
}


def with_share(value: Any) -> dict[str, Any]:
    found = copy.deepcopy(GOOD)
    found["spec"]["config"] = {KEY: value}
    return found


def schema() -> dict[str, Any]:
    result: dict[str, Any] = generate_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    return result


@pytest.mark.parametrize("value", [0.25, 0.001, 1, 1.0])
def test_a_share_in_the_interval_is_taken_by_the_crd_and_the_model(value: float) -> None:
    admission = admit(with_share(value), schema())
    assert admission.errors == [] and admission.unknown_fields == []
    parsed = parse_app(with_share(value))
    assert (
        StreamsConfig.from_properties(dict(parsed.spec.config)).rocksdb_memory_limit_share == value
    )


@pytest.mark.parametrize("value", [0, 0.0, -0.5, 1.01, 2])
def test_a_share_outside_the_interval_is_refused_naming_the_key_and_the_values(
    value: float,
) -> None:
    errors = [error.message() for error in admit(with_share(value), schema()).errors]
    assert len(errors) == 1, errors
    assert errors[0].startswith(f"spec.config.{KEY}: Invalid value")
    assert f"{KEY} must be a number above 0 and at most 1" in errors[0]
    with pytest.raises(ManifestError) as refused:
        parse_app(with_share(value))
    assert KEY in str(refused.value)


def test_a_share_that_is_not_a_number_is_refused_by_its_type() -> None:
    errors = [error.message() for error in admit(with_share("half"), schema()).errors]
    assert errors == [
        f'spec.config.{KEY}: Invalid value: "half": spec.config.{KEY} in body must be of type '
        'number: "half"'
    ]


def test_the_crd_defaults_the_share_to_the_runtimes_default() -> None:
    stored = admit(copy.deepcopy(GOOD), schema()).obj
    assert (
        stored["spec"]["config"][KEY]
        == StreamsConfig.from_properties({}).rocksdb_memory_limit_share
    )

"""The log a backfill test runs on: the embedded log, and the project's Kafka broker."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from eddyline_runtime.log import Log
from eddyline_runtime.log.sqlite_log import SqliteLog
from tests.support.backfill_kill import open_test_log


@pytest.fixture(params=["sqlite", pytest.param("kafka", marks=pytest.mark.slow)])
def log(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Log]:
    """Each test using it runs on both logs (Kafka's topics under a prefix of its own)."""
    if request.param == "sqlite":
        opened: Log = SqliteLog(tmp_path / "log.db")
    else:
        bootstrap: str = request.getfixturevalue("kafka_bootstrap")
        opened = open_test_log(f"kafka://{bootstrap}", f"backfill-{uuid.uuid4().hex[:8]}.")
    yield opened
    opened.close()

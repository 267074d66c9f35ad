"""A store with logging disabled has no changelog: the paths that would need one refuse
it with the store named and the way out, rather than failing on a missing topic.

A run with standbys or exactly-once is refused by ``refuse_unlogged_stores``
(tests/unit/engine); here, the Spark restore build and its ingest."""

from __future__ import annotations

from pathlib import Path

import pytest

from eddyline_runtime.cli import main
from eddyline_runtime.log import SqliteLog

APP = "unlogged-app"

TOPOLOGY = """
from eddyline_runtime.processing import Materialized, StreamsBuilder


def topology():
    builder = StreamsBuilder()
    grouped = builder.stream("input", key_serde="string").group_by_key()
    grouped.count(Materialized.as_("local-counts").with_logging_disabled())
    grouped.count("logged-counts")
    return builder.build()
"""


@pytest.fixture
def app_dir(tmp_path: Path) -> Path:
    (tmp_path / "unlogged_app.py").write_text(TOPOLOGY)
    (tmp_path / "streamapp.yaml").write_text(
        f"""apiVersion: eddyline.dev/v1alpha1
kind: StreamApp
metadata:
  name: {APP}
spec:
  topology: unlogged_app:topology
  image: example/image:1
  log:
    url: sqlite:///{tmp_path}/log.db
  config:
    state.dir: {tmp_path}/state
"""
    )
    SqliteLog(tmp_path / "log.db").close()
    return tmp_path


def _restore(app_dir: Path, action: str, store: str) -> list[str]:
    args = ["restore", action, "--manifest", str(app_dir / "streamapp.yaml"), "--store", store]
    if action == "build":
        return [*args, "--output", str(app_dir / "builds")]
    return [*args, "--partition", "0", "--from", str(app_dir / "builds")]


@pytest.mark.parametrize("action", ["build", "ingest"])
def test_a_spark_restore_refuses_a_store_with_logging_disabled(
    app_dir: Path, action: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(_restore(app_dir, action, "local-counts")) == 1
    error = capsys.readouterr().err
    assert 'store "local-counts" has logging disabled' in error
    assert "Enable its logging" in error


def test_a_logged_store_without_its_changelog_yet_gets_the_usual_answer(
    app_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The refusal is for unlogged stores only: a logged one whose changelog the app has
    not created yet is told to run the app once."""
    assert main(_restore(app_dir, "build", "logged-counts")) == 1
    error = capsys.readouterr().err
    assert "logging disabled" not in error
    assert "run the app once to create it" in error

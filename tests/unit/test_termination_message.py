"""A runtime that refuses to start says why where Kubernetes looks: the termination message."""

from __future__ import annotations

from pathlib import Path

import pytest

from eddyline_runtime.cli import TERMINATION_MESSAGE_ENV, main


def test_a_refused_start_writes_its_error_to_the_termination_message_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    message = tmp_path / "termination-log"
    monkeypatch.setenv(TERMINATION_MESSAGE_ENV, str(message))
    assert main(["run", str(tmp_path / "missing.yaml")]) == 1
    assert "missing.yaml" in message.read_text(encoding="utf-8")


def test_without_the_variable_nothing_is_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(TERMINATION_MESSAGE_ENV, raising=False)
    monkeypatch.chdir(tmp_path)
    assert main(["run", str(tmp_path / "missing.yaml")]) == 1
    assert list(tmp_path.iterdir()) == []

"""A restore Job's verdict: what it built, or why it failed.

The Job's container writes it twice: beside the builds on the shared claim,
``OUTPUT/<application>/<store>/_jobs/<job>.json`` (:func:`write_job_result`;
waiting tasks read it, :mod:`~eddyline_runtime.restore.ingest.build_wait`) and
as its termination message (the operator reads it from the pod's status). It
imports nothing of the runtime, so the operator can read it without pulling
in the log or the stores.

The Job judges its own success from the driver's exit status *and* the
manifests on disk (spark-submit's exit code alone can say 0 for a driver
that failed).
"""

from __future__ import annotations

import contextlib
import enum
import os
import secrets
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Final

from pydantic import BaseModel, ConfigDict, Field, ValidationError


class JobState(enum.StrEnum):
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"


class JobResult(BaseModel):
    """What one restore Job attempt did; also the Job pod's termination message."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    state: JobState
    application: str
    store: str
    partitions: tuple[int, ...]
    build_id: str | None = None
    # Store partition -> the changelog offset its manifest covers (the last record included).
    offsets: dict[int, int] = Field(default_factory=dict)
    driver_exit_code: int | None = None
    message: str = ""
    finished_at: float = Field(default_factory=time.time, description="Unix time")

    def to_text(self) -> str:
        return self.model_dump_json()

    @classmethod
    def from_text(cls, text: str) -> JobResult | None:
        """A result, or None for text that is not one (a truncated termination message)."""
        try:
            return cls.model_validate_json(text)
        except ValidationError:
            return None


JOB_RESULTS_DIR: Final = "_jobs"


def job_results_directory(output: Path, application: str, store: str) -> Path:
    return output / application / store / JOB_RESULTS_DIR


def write_job_result(output: Path, job: str, result: JobResult) -> Path:
    """Write atomically (temporary name, rename): a waiting task reads it whole or not at all."""
    directory = job_results_directory(output, result.application, result.store)
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{job}.json"
    temporary = directory / f".{job}.{secrets.token_hex(4)}.tmp"
    with open(temporary, "w", encoding="utf-8") as handle:
        handle.write(result.to_text())
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(temporary, path)
    return path


def job_results(output: Path, application: str, store: str) -> Iterator[JobResult]:
    directory = job_results_directory(output, application, store)
    if not directory.is_dir():
        return
    for path in sorted(directory.glob("*.json")):
        with contextlib.suppress(OSError):
            result = JobResult.from_text(path.read_text(encoding="utf-8"))
            if result is not None:
                yield result

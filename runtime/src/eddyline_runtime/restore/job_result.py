"""A restore Job's verdict: what it built, or why it failed.

The Job's container writes it twice: beside the builds on the shared claim
(waiting tasks read it, :mod:`~eddyline_runtime.restore.build_job`) and as its
termination message (the operator reads it from the pod's status). It
imports nothing of the runtime, so the operator can read it without pulling
in the log or the stores.
"""

from __future__ import annotations

import enum
import time

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

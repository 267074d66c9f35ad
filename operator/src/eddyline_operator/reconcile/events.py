"""An Event about the StreamApp that a cycle wants posted (the handlers post it)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Event:
    type: str  # Normal or Warning
    reason: str
    message: str

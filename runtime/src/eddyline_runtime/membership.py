"""The published membership: who is in the group and which tasks each member runs.

One writer publishes it (the local group's supervisor locally, the operator on
a cluster) and every member follows it. It is a generation number and an
:class:`~eddyline_runtime.assignor.Assignment`; members act on a generation
they have not seen yet. Safety never rests on members reading it in time:
taking a task over fences its previous owner's transactional producer.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from eddyline_runtime.assignor import Assignment

# The file name a local group publishes under its state.dir.
MEMBERSHIP_FILE = "membership.json"


@dataclass(frozen=True)
class Membership:
    """What the membership file holds: a generation number and the assignment."""

    generation: int
    assignment: Assignment

    @classmethod
    def read(cls, path: Path) -> Membership | None:
        """The published membership, or None when there is none (yet)."""
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return None
        return cls.from_json(data)

    def write(self, path: Path) -> None:
        """Replace the file atomically: readers see the old or the new one, never half."""
        temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        temporary.write_text(
            json.dumps(self.to_json()),
            encoding="utf-8",
        )
        os.replace(temporary, path)

    def to_json(self) -> dict[str, Any]:
        return {"generation": self.generation, "assignment": self.assignment.to_json()}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Membership:
        return cls(int(data["generation"]), Assignment.from_json(data["assignment"]))

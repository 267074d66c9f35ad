"""The root of eddyline's errors, and the errors of configuration.

Every error eddyline raises on purpose derives from :class:`EddylineError`,
so a caller can catch ours apart from bugs. Each message names the thing that
is wrong (in quotes) and says what to do about it.

    EddylineError
    ├── ConfigError (also ValueError)            a setting has a value we cannot accept
    │   ├── UnknownIsolationLevelError           default.state.isolation.level / a query's isolation
    │   └── InvalidUncommittedBytesLimitError    statestore.uncommitted.max.bytes < -1
    └── StateStoreError                          eddyline_runtime.state.errors draws its subtree
"""

from __future__ import annotations

import re
from collections.abc import Iterable


class EddylineError(Exception):
    """Base of every error eddyline raises on purpose."""


def record_failure_line(task: str, topic: str, partition: int, offset: int) -> str:
    """How the one line a task stops with on a failed record begins (the runtime's
    ``TaskProcessingError``); :data:`RECORD_FAILURE` finds it again in a pod's
    termination message, for the operator's ``RecordFailed`` condition."""
    return f"task {task} failed processing {topic}-{partition} at offset {offset}"


# The line record_failure_line begins, anywhere in a text (a topic name has no spaces).
RECORD_FAILURE = re.compile(r"task \S+ failed processing \S+-\d+ at offset \d+")


class InvalidArgumentError(EddylineError, ValueError):
    """A value handed to eddyline (an address, a task id, a bound) that it cannot accept.

    The message names the value and what would do.
    """


class ConfigError(EddylineError, ValueError):
    """A setting has a value eddyline cannot accept.

    ``key`` is the setting's name as the user wrote it (Kafka Streams' names),
    ``value`` what was given and ``accepted`` a human description of what would do.
    """

    def __init__(self, key: str, value: object, accepted: str, *, hint: str = "") -> None:
        self.key = key
        self.value = value
        self.accepted = accepted
        message = f'invalid value {value!r} for "{key}": accepted values are {accepted}'
        if hint:
            message += f"; {hint}"
        super().__init__(message)


def one_of(values: Iterable[str]) -> str:
    """Render a closed set of accepted values for an error message."""
    return ", ".join(repr(v) for v in values)


class UnknownIsolationLevelError(ConfigError):
    """An isolation level that is neither READ_COMMITTED nor READ_UNCOMMITTED."""


class InvalidUncommittedBytesLimitError(ConfigError):
    """A ``statestore.uncommitted.max.bytes`` below -1."""

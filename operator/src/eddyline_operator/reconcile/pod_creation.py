"""Whether the StatefulSet controller is failing to create the app's pods. Pure.

A pod the StatefulSet controller cannot create (a pods quota, a quota that needs
requests/limits, a pod spec the server refuses) leaves no pod to look at: the controller
only records a ``FailedCreate`` Event on the StatefulSet, again at each retry. Without
reading it the app said ``Progressing ... 0 pods, 1 wanted`` and ``Degraded=False``
forever. The handlers list the StatefulSet's Events only while pods are missing (one list,
no cost for a settled app); :func:`failure` reads them.
"""

from __future__ import annotations

import datetime
from collections.abc import Iterable
from typing import Any

Obj = dict[str, Any]

FAILED = "FailedCreate"
SUCCEEDED = "SuccessfulCreate"
# An Event's message can be long (a whole admission refusal); status keeps this much of it.
MAX_MESSAGE = 1000


def field_selector(stateful_set: str) -> str:
    """The Events the StatefulSet controller records about ``stateful_set``."""
    return f"involvedObject.kind=StatefulSet,involvedObject.name={stateful_set}"


def _when(event: Obj) -> datetime.datetime:
    text = (
        event.get("lastTimestamp")
        or event.get("eventTime")
        or (event.get("metadata") or {}).get("creationTimestamp")
        or ""
    )
    try:
        return datetime.datetime.fromisoformat(str(text).replace("Z", "+00:00"))
    except ValueError:
        return datetime.datetime.min.replace(tzinfo=datetime.UTC)


def failure(events: Iterable[Obj], *, stateful_set_uid: str | None = None) -> str | None:
    """The controller's message when its latest word on creating pods is ``FailedCreate``
    (not followed by a ``SuccessfulCreate``), else None. Events of an earlier StatefulSet of
    the same name are left out when ``stateful_set_uid`` is given."""
    latest: Obj | None = None
    for event in events:
        if event.get("reason") not in (FAILED, SUCCEEDED):
            continue
        uid = (event.get("involvedObject") or {}).get("uid")
        if stateful_set_uid is not None and uid not in (None, stateful_set_uid):
            continue
        # At the same second a failure wins: some pod was not made.
        key = (_when(event), event.get("reason") == FAILED)
        if latest is None or key > (_when(latest), latest.get("reason") == FAILED):
            latest = event
    if latest is None or latest.get("reason") != FAILED:
        return None
    message = str(latest.get("message") or "no message")
    count = latest.get("count")
    times = f" ({count} times)" if isinstance(count, int) and count > 1 else ""
    return message[:MAX_MESSAGE] + times

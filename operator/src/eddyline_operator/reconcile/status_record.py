"""The StreamApp's status in and out: read once into :class:`StreamAppStatus`, dumped in one place.

Everything between (the plan, conditions, upgrades, restore Jobs) works on the typed model;
only :func:`read_status` sees the stored dict and only :func:`dump_status` makes one (the
handlers send what it returns as a merge patch).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import ValidationError

from eddyline_runtime.spec import StreamAppStatus

Obj = dict[str, Any]


def read_status(stored: Any) -> tuple[StreamAppStatus, list[str]]:
    """The stored status as the model, and the top-level fields that could not be read.

    The operator is the only writer and the CRD holds the same schema, so a field that does
    not validate is one an older operator wrote differently (or someone edited by hand): it
    is dropped and recomputed instead of stopping every cycle of the app. The names are
    returned so the cycle can say so.
    """
    document = dict(stored) if isinstance(stored, Mapping) else {}
    dropped: list[str] = []
    while True:
        try:
            return StreamAppStatus.model_validate(document), sorted(dropped)
        except ValidationError as invalid:
            bad = {str(e["loc"][0]) for e in invalid.errors() if e["loc"]}
            if not bad & document.keys():
                # Nothing left to drop (cannot happen with a mapping; kept for safety).
                return StreamAppStatus(), sorted(dropped + list(document))
            for key in bad & document.keys():
                del document[key]
                dropped.append(key)


def dump_status(status: StreamAppStatus) -> Obj:
    """The status as the API server takes it. Every field is present: a None clears it when
    sent as a merge patch (an upgrade that ended, a log no longer pinned)."""
    return status.model_dump(mode="json", by_alias=True)


def status_differs(stored: Any, planned: StreamAppStatus) -> bool:
    """Whether writing ``planned`` would change what is stored (compared as the model reads
    both: a null the API server dropped is the same as an absent field)."""
    current, _ = read_status(stored)
    return _comparable(dump_status(current)) != _comparable(dump_status(planned))


def _comparable(dumped: Obj) -> Obj:
    """``dumped`` with an autoscaling status that holds nothing read as none: the CRD
    defaults ``status.autoscaling`` to ``{}``, so the null a plan without an autoscaler
    writes comes back as ``{}``; compared as they were, every cycle of every app without
    ``spec.autoscaling`` wrote its status again (and got a watch event back), the largest
    part of the operator's and the API server's work with many apps (issue 38)."""
    autoscaling = dumped.get("autoscaling")
    if isinstance(autoscaling, dict) and all(v is None for v in autoscaling.values()):
        return {**dumped, "autoscaling": None}
    return dumped

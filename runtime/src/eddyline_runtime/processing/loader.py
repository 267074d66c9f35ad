"""Load the user's topology from a ``module:function`` reference (a StreamApp's ``spec.topology``).

The function takes no arguments and returns a :class:`Topology` or a
:class:`StreamsBuilder`. Modules are looked up on ``sys.path`` first, then in
the directories given (the manifest's own directory, so an example's
``topology.py`` next to its manifest just works).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from eddyline_runtime.errors import EddylineError
from eddyline_runtime.processing.dsl import StreamsBuilder
from eddyline_runtime.processing.topology import Topology
from eddyline_runtime.references import (
    Reference,
    ReferenceFailure,
    ReferenceLoadError,
    described,
    load_reference,
)


class TopologyLoadError(EddylineError):
    """The topology reference cannot be imported, called, or returned something else."""


def load_topology(reference: str, search_path: Sequence[Path] = ()) -> Topology:
    parsed = Reference.parse(reference)
    if parsed is None:
        raise TopologyLoadError(
            f'spec.topology "{reference}" is not a module:function reference, '
            'e.g. "wordcount.topology:build"'
        )
    searched = ", ".join(str(p) for p in search_path) or "sys.path"
    way_out = {
        ReferenceFailure.NOT_FOUND: f"searched sys.path and {searched}. Install the package in "
        "the image, or put the module next to the manifest",
        ReferenceFailure.RAISED: "fix the topology code",
        ReferenceFailure.EXITED: "a topology module must not exit the process",
    }
    try:
        function = load_reference(reference, search_path)
    except ReferenceLoadError as exc:
        if exc.failure is ReferenceFailure.NO_ATTRIBUTE:
            function = None
        else:
            raise TopologyLoadError(
                f'spec.topology "{reference}": {exc.detail}; {way_out[exc.failure]}'
            ) from exc.__cause__
    if not callable(function):
        raise TopologyLoadError(
            f'spec.topology "{reference}": module "{parsed.module}" has no function '
            f'"{parsed.attribute}"'
        )
    try:
        built = function()
    except EddylineError:
        raise
    except Exception as exc:
        raise TopologyLoadError(
            f'spec.topology "{reference}" raised {described(exc)}; fix the topology code'
        ) from exc
    except SystemExit as exc:
        raise TopologyLoadError(
            f'spec.topology "{reference}" called sys.exit({exc.code!r}); a topology function '
            "must return a Topology or a StreamsBuilder, not exit the process"
        ) from exc
    if isinstance(built, StreamsBuilder):
        built = built.build()
    if not isinstance(built, Topology):
        raise TopologyLoadError(
            f'spec.topology "{reference}" returned {type(built).__name__}; it must return a '
            "Topology or a StreamsBuilder"
        )
    return built

"""Load the user's topology from a ``module:function`` reference (a StreamApp's ``spec.topology``).

The function takes no arguments and returns a :class:`Topology` or a
:class:`StreamsBuilder`. Modules are looked up on ``sys.path`` first, then in
the directories given (the manifest's own directory, so an example's
``topology.py`` next to its manifest just works).
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Sequence
from pathlib import Path

from eddyline_runtime.errors import EddylineError
from eddyline_runtime.processing.dsl import StreamsBuilder
from eddyline_runtime.processing.topology import Topology


class TopologyLoadError(EddylineError):
    """The topology reference cannot be imported, called, or returned something else."""


def load_topology(reference: str, search_path: Sequence[Path] = ()) -> Topology:
    module_name, _, function_name = reference.partition(":")
    if not module_name or not function_name:
        raise TopologyLoadError(
            f'spec.topology "{reference}" is not a module:function reference, '
            'e.g. "wordcount.topology:build"'
        )
    for directory in reversed(search_path):
        if str(directory) not in sys.path:
            sys.path.append(str(directory))
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        searched = ", ".join(str(p) for p in search_path) or "sys.path"
        raise TopologyLoadError(
            f'spec.topology "{reference}": cannot import module "{module_name}" ({exc}); '
            f"searched sys.path and {searched}. Install the package in the image, or put the "
            "module next to the manifest"
        ) from exc
    function = getattr(module, function_name, None)
    if not callable(function):
        raise TopologyLoadError(
            f'spec.topology "{reference}": module "{module_name}" has no function "{function_name}"'
        )
    built = function()
    if isinstance(built, StreamsBuilder):
        built = built.build()
    if not isinstance(built, Topology):
        raise TopologyLoadError(
            f'spec.topology "{reference}" returned {type(built).__name__}; it must return a '
            "Topology or a StreamsBuilder"
        )
    return built

"""Load the user's topology from a ``module:function`` reference (a StreamApp's ``spec.topology``).

The function takes no arguments and returns a :class:`Topology` or a
:class:`StreamsBuilder`. Modules are looked up on ``sys.path`` first, then in
the directories given (the manifest's own directory, so an example's
``topology.py`` next to its manifest just works).
"""

from __future__ import annotations

import importlib
import sys
import traceback
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
    except Exception as exc:  # the module's own code failed as it was imported
        raise TopologyLoadError(
            f'spec.topology "{reference}": importing module "{module_name}" raised '
            f"{_described(exc)}; fix the topology code"
        ) from exc
    except SystemExit as exc:  # sys.exit() at import would end the runtime without a word
        raise TopologyLoadError(
            f'spec.topology "{reference}": importing module "{module_name}" called '
            f"sys.exit({exc.code!r}); a topology module must not exit the process"
        ) from exc
    function = getattr(module, function_name, None)
    if not callable(function):
        raise TopologyLoadError(
            f'spec.topology "{reference}": module "{module_name}" has no function "{function_name}"'
        )
    try:
        built = function()
    except EddylineError:
        raise
    except Exception as exc:
        raise TopologyLoadError(
            f'spec.topology "{reference}" raised {_described(exc)}; fix the topology code'
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


def _described(error: Exception) -> str:
    """The error and where in the user's code it happened (the last frame), in one line."""
    if isinstance(error, SyntaxError):
        return f"SyntaxError: {error.msg} at {error.filename}:{error.lineno}"
    frames = traceback.extract_tb(error.__traceback__)
    where = f" at {frames[-1].filename}:{frames[-1].lineno}" if frames else ""
    return f"{type(error).__name__}: {error}{where}"

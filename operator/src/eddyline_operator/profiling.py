"""An opt-in CPU profile of the operator process, for measuring where a cycle's time goes.

``EDDYLINE_OPERATOR_PROFILE=<file>`` (unset: nothing is profiled, nothing costs) profiles the
main thread (kopf's event loop: watch streams, its handler machinery) and every cycle thread
(the operator's executor, :func:`profile_thread` as its initializer) with :mod:`cProfile`, and
writes the merged statistics to ``<file>`` when the process exits (``python -m pstats <file>``
reads them). cProfile sees only the thread that enabled it, hence one profiler per thread.
"""

from __future__ import annotations

import atexit
import cProfile
import os
import pstats
import threading

PROFILE_ENV = "EDDYLINE_OPERATOR_PROFILE"

_profiles: list[cProfile.Profile] = []
_lock = threading.Lock()


def profile_thread() -> None:
    """Profile the calling thread from now on, when ``EDDYLINE_OPERATOR_PROFILE`` is set."""
    if not os.environ.get(PROFILE_ENV, "").strip():
        return
    profile = cProfile.Profile()
    profile.enable()
    with _lock:
        _profiles.append(profile)


def start() -> None:
    """Profile the calling (main) thread and write every thread's profile at exit, when
    ``EDDYLINE_OPERATOR_PROFILE`` is set."""
    path = os.environ.get(PROFILE_ENV, "").strip()
    if not path:
        return
    profile_thread()
    atexit.register(write, path)


def write(path: str) -> None:
    """Every profiled thread's statistics so far, merged, to ``path``."""
    with _lock:
        profiles = list(_profiles)
    if not profiles:
        return
    merged = pstats.Stats(profiles[0])
    for profile in profiles[1:]:
        merged.add(profile)
    merged.dump_stats(path)

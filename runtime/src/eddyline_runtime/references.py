"""User code named by a ``module:attribute`` reference, loaded one way.

A topology (``spec.topology``), a serde (``key.serde``/``value.serde``) and an
exception handler (``*.exception.handler``) may each name user code as
``module:attribute``. They differ in what the attribute must be and in the
message that names the setting; parsing the reference, importing the module
and telling apart the ways that fails are the same, and live here.

A module's own code runs as it is imported, so every failure of it is caught
and described (where in the user's code, in one line): an exception, a syntax
error, and ``sys.exit()``, which would otherwise end the runtime without a word.
"""

from __future__ import annotations

import enum
import importlib
import sys
import traceback
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from eddyline_runtime.errors import EddylineError


class ReferenceFailure(enum.Enum):
    """Why a reference could not be loaded."""

    MALFORMED = "malformed"  # not module:attribute
    NOT_FOUND = "not found"  # the module is not importable
    RAISED = "raised"  # the module's code raised as it was imported
    EXITED = "exited"  # the module's code called sys.exit() as it was imported
    NO_ATTRIBUTE = "no attribute"  # the module has no such attribute


class ReferenceLoadError(EddylineError):
    """A ``module:attribute`` reference that cannot be loaded.

    ``detail`` says why in the user's terms without naming the setting: the
    caller prefixes the setting and adds its way out.
    """

    def __init__(self, reference: str, failure: ReferenceFailure, detail: str) -> None:
        super().__init__(detail)
        self.reference = reference
        self.failure = failure
        self.detail = detail


@dataclass(frozen=True)
class Reference:
    """A parsed ``module:attribute`` reference."""

    module: str
    attribute: str

    @classmethod
    def parse(cls, text: str) -> Reference | None:
        """The reference ``text`` spells, or None when it is not ``module:attribute``."""
        module, _, attribute = text.partition(":")
        if not module or not attribute:
            return None
        return cls(module, attribute)


def load_reference(text: str, search_path: Sequence[Path] = ()) -> object:
    """The attribute ``text`` names, its module imported now.

    ``search_path`` directories are appended to ``sys.path`` (after what is
    installed: an installed package wins over a file of the same name).
    Raises :class:`ReferenceLoadError` saying which way it failed.
    """
    reference = Reference.parse(text)
    if reference is None:
        raise ReferenceLoadError(
            text, ReferenceFailure.MALFORMED, f'"{text}" is not a module:attribute reference'
        )
    for directory in reversed(search_path):
        if str(directory) not in sys.path:
            sys.path.append(str(directory))
    module_name = reference.module
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ReferenceLoadError(
            text, ReferenceFailure.NOT_FOUND, f'cannot import module "{module_name}" ({exc})'
        ) from exc
    except Exception as exc:
        raise ReferenceLoadError(
            text,
            ReferenceFailure.RAISED,
            f'importing module "{module_name}" raised {described(exc)}',
        ) from exc
    except SystemExit as exc:
        raise ReferenceLoadError(
            text,
            ReferenceFailure.EXITED,
            f'importing module "{module_name}" called sys.exit({exc.code!r})',
        ) from exc
    try:
        return getattr(module, reference.attribute)
    except AttributeError:
        raise ReferenceLoadError(
            text,
            ReferenceFailure.NO_ATTRIBUTE,
            f'module "{module_name}" has no attribute "{reference.attribute}"',
        ) from None


def described(error: BaseException) -> str:
    """The error and where in the user's code it happened (the last frame), in one line."""
    if isinstance(error, SyntaxError):
        return f"SyntaxError: {error.msg} at {error.filename}:{error.lineno}"
    frames = traceback.extract_tb(error.__traceback__)
    where = f" at {frames[-1].filename}:{frames[-1].lineno}" if frames else ""
    return f"{type(error).__name__}: {error}{where}"

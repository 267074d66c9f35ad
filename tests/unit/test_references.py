"""``module:attribute`` references: each way loading fails is told apart, named, and
never ends the process (a module calling sys.exit() at import included)."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from eddyline_runtime.errors import ConfigError
from eddyline_runtime.processing.loader import TopologyLoadError, load_topology
from eddyline_runtime.references import (
    Reference,
    ReferenceFailure,
    ReferenceLoadError,
    load_reference,
)
from eddyline_runtime.serde import serde_for


@pytest.fixture
def modules(tmp_path: Path) -> Iterator[Path]:
    """A directory of user modules, removed from sys.path and sys.modules afterwards."""
    (tmp_path / "refs_good.py").write_text("VALUE = 42\n", encoding="utf-8")
    (tmp_path / "refs_raising.py").write_text("x = 1\nraise ValueError('boom')\n", encoding="utf-8")
    (tmp_path / "refs_exiting.py").write_text("import sys\nsys.exit(7)\n", encoding="utf-8")
    (tmp_path / "refs_broken.py").write_text("def f(:\n", encoding="utf-8")
    before = list(sys.path)
    yield tmp_path
    sys.path[:] = before
    for name in [n for n in sys.modules if n.startswith("refs_")]:
        del sys.modules[name]


@pytest.mark.parametrize(
    ("text", "parsed"),
    [
        ("a.b:c", Reference("a.b", "c")),
        ("a:", None),
        (":c", None),
        ("plain", None),
    ],
)
def test_a_reference_is_module_colon_attribute(text: str, parsed: Reference | None) -> None:
    assert Reference.parse(text) == parsed


def test_a_found_attribute_is_returned(modules: Path) -> None:
    assert load_reference("refs_good:VALUE", [modules]) == 42


@pytest.mark.parametrize(
    ("text", "failure", "detail"),
    [
        ("refs_good", ReferenceFailure.MALFORMED, "is not a module:attribute reference"),
        ("refs_missing:x", ReferenceFailure.NOT_FOUND, 'cannot import module "refs_missing"'),
        ("refs_raising:x", ReferenceFailure.RAISED, "raised ValueError: boom at "),
        ("refs_broken:x", ReferenceFailure.RAISED, "raised SyntaxError: "),
        ("refs_exiting:x", ReferenceFailure.EXITED, "called sys.exit(7)"),
        ("refs_good:missing", ReferenceFailure.NO_ATTRIBUTE, 'has no attribute "missing"'),
    ],
)
def test_each_failure_is_told_apart_and_named(
    modules: Path, text: str, failure: ReferenceFailure, detail: str
) -> None:
    with pytest.raises(ReferenceLoadError) as raised:
        load_reference(text, [modules])
    assert raised.value.failure is failure
    assert detail in raised.value.detail


def test_a_serde_module_that_exits_at_import_is_a_config_error(modules: Path) -> None:
    """Before the loading was shared, a serde's module calling sys.exit() ended the process."""
    sys.path.append(str(modules))
    with pytest.raises(ConfigError, match=r"could not load it: .*called sys.exit\(7\)"):
        serde_for("refs_exiting:Serde", key="value.serde")


def test_a_topology_reference_names_the_setting_and_the_way_out(modules: Path) -> None:
    with pytest.raises(TopologyLoadError, match="must not exit the process"):
        load_topology("refs_exiting:topology", [modules])
    with pytest.raises(TopologyLoadError, match='has no function "topology"'):
        load_topology("refs_good:topology", [modules])

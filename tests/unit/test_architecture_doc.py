"""docs/architecture.md names every module of the tree, and only modules that exist.

Its module tables hold each module as a backticked path relative to its
package root (`engine/stream_thread.py`, `reconcile/plan.py`). A module added,
moved or deleted without the page following fails here.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "architecture.md"
PACKAGES = {
    "runtime": ROOT / "runtime" / "src" / "eddyline_runtime",
    "operator": ROOT / "operator" / "src" / "eddyline_operator",
}
# A table row's first cell: | `path/to/module.py` |
_ROW = re.compile(r"^\|\s*`([A-Za-z0-9_/]+\.py)`\s*\|", re.MULTILINE)


def modules_in_tree() -> dict[str, set[str]]:
    return {
        side: {p.relative_to(root).as_posix() for p in root.rglob("*.py")}
        for side, root in PACKAGES.items()
    }


def modules_in_doc() -> dict[str, set[str]]:
    text = DOC.read_text(encoding="utf-8")
    runtime_part, _, operator_part = text.partition("## The operator:")
    return {
        "runtime": set(_ROW.findall(runtime_part)),
        "operator": set(_ROW.findall(operator_part.partition("\n## ")[0])),
    }


def test_every_module_of_the_tree_is_in_the_architecture_page() -> None:
    tree, doc = modules_in_tree(), modules_in_doc()
    for side in PACKAGES:
        missing = sorted(tree[side] - doc[side])
        assert missing == [], f"docs/architecture.md lacks {side} modules: {missing}"


def test_the_architecture_page_names_no_module_that_does_not_exist() -> None:
    tree, doc = modules_in_tree(), modules_in_doc()
    for side in PACKAGES:
        stale = sorted(doc[side] - tree[side])
        assert stale == [], f"docs/architecture.md names {side} modules that do not exist: {stale}"


def test_the_page_is_read_as_intended() -> None:
    """The parse finds the tables (an empty parse would make the checks above vacuous)."""
    doc = modules_in_doc()
    assert "engine/stream_thread.py" in doc["runtime"]
    assert "reconcile/plan.py" in doc["operator"]
    assert "reconcile/plan.py" not in doc["runtime"]

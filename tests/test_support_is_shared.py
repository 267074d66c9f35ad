"""Test support lives in ``tests/support`` only: no test module grows its own copy again.

Reads every Python file of the tests tree outside ``tests/support`` (as source,
without importing it) and fails naming each one that defines a poll-until-true
``wait_for``, a free-port helper, or finds a free port itself (binds port 0 and
reads the port back), or that imports a helper by its bare module name (which only
worked while pytest put every test folder on ``sys.path``).
"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
SUPPORT = TESTS / "support"
# Names of the helpers tests/support holds; another definition is a copy.
WAIT_HELPER = re.compile(r"^_?wait_for$|^_?wait_until$")
PORT_HELPER = re.compile(r"free.*port|port.*free", re.IGNORECASE)
# Module names a test may import bare: none is a file of the tests tree, except
# faulty_sst_sink, which Spark ships to its workers with addPyFile and they import bare.
SHIPPED_TO_SPARK = {"faulty_sst_sink"}


def modules_to_check() -> list[Path]:
    return sorted(
        path
        for path in TESTS.rglob("*.py")
        if SUPPORT not in path.parents and "__pycache__" not in path.parts
    )


def copies_in(source: str, name: str, local_modules: set[str]) -> list[str]:
    """What the module ``name`` defines or imports that belongs in tests/support, a line each."""
    found = []
    for node in ast.walk(ast.parse(source, filename=name)):
        where = f"{name}:{getattr(node, 'lineno', 0)}"
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            if WAIT_HELPER.search(node.name):
                found.append(f"{where}: defines {node.name}; use tests.support.waiting.wait_for")
            elif PORT_HELPER.search(node.name) and not node.name.startswith("test_"):
                found.append(f"{where}: defines {node.name}; use tests.support.ports")
        elif isinstance(node, ast.Call) and _binds_port_zero(node):
            found.append(f"{where}: binds port 0 to find a free port; use tests.support.ports")
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            top = node.module.split(".")[0]
            if top in local_modules and top not in SHIPPED_TO_SPARK:
                found.append(f"{where}: imports {top} by bare name; import it as tests.<path>")
        elif isinstance(node, ast.Import):
            for alias in node.names:
                top = alias.name.split(".")[0]
                if top in local_modules and top not in SHIPPED_TO_SPARK:
                    found.append(f"{where}: imports {top} by bare name; import it as tests.<path>")
    return found


def _binds_port_zero(call: ast.Call) -> bool:
    """``<socket>.bind((host, 0))``: the free-port idiom (a server binding its own port 0
    through a constructor is not one)."""
    if not (isinstance(call.func, ast.Attribute) and call.func.attr == "bind" and call.args):
        return False
    address = call.args[0]
    return (
        isinstance(address, ast.Tuple)
        and len(address.elts) == 2
        and isinstance(address.elts[1], ast.Constant)
        and address.elts[1].value == 0
    )


def local_module_names() -> set[str]:
    """Every module and package name of the tests tree (what a bare import would find)."""
    names = {path.stem for path in TESTS.rglob("*.py") if path.stem != "__init__"}
    names |= {path.parent.name for path in TESTS.rglob("__init__.py")}
    # A folder named as a standard module (tests/unit/operator) does not shadow it.
    return names - {"tests"} - set(sys.stdlib_module_names)


def test_no_test_module_defines_its_own_wait_for_or_free_port_helper() -> None:
    local = local_module_names()
    found = [
        line
        for path in modules_to_check()
        for line in copies_in(
            path.read_text(encoding="utf-8"), str(path.relative_to(TESTS.parent)), local
        )
    ]
    assert found == [], "\n".join(found)


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("def wait_for(what, condition):\n    pass\n", "defines wait_for"),
        ("def free_base_port(count):\n    pass\n", "defines free_base_port"),
        (
            "import socket\nwith socket.socket() as s:\n    s.bind(('127.0.0.1', 0))\n",
            "binds port 0",
        ),
        ("from word_count import APP\n", "imports word_count by bare name"),
    ],
)
def test_the_check_finds_each_kind_of_copy(source: str, expected: str) -> None:
    found = copies_in(source, "tests/unit/test_copy.py", {"word_count"})
    assert len(found) == 1 and expected in found[0], found

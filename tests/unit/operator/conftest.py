"""Fixtures of the operator's unit tests."""

from __future__ import annotations

from typing import Any

import pytest
from k8s_objects import three_zones


@pytest.fixture
def nodes() -> list[dict[str, Any]]:
    return three_zones()

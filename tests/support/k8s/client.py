"""A few lines of plain HTTP to the emulator, for tests that check API semantics directly."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any


class Response:
    def __init__(self, status: int, body: Any) -> None:
        self.status, self.body = status, body

    def __repr__(self) -> str:
        return f"Response({self.status}, {self.body!r})"


def request(
    url: str,
    method: str = "GET",
    body: Any = None,
    *,
    content_type: str = "application/json",
    headers: dict[str, str] | None = None,
    timeout: float = 30,
) -> Response:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method)
    req.add_header("Content-Type", content_type)
    for name, value in (headers or {}).items():
        req.add_header(name, value)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as response:
            return Response(response.status, _decode(response.read()))
    except urllib.error.HTTPError as error:
        return Response(error.code, _decode(error.read()))


def watch_events(url: str, timeout: float = 30) -> list[dict[str, Any]]:
    """Every event of a watch that ends by itself (``timeoutSeconds``)."""
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return [json.loads(line) for line in response.read().splitlines() if line.strip()]


def _decode(data: bytes) -> Any:
    try:
        return json.loads(data)
    except json.JSONDecodeError:
        return data.decode(errors="replace")

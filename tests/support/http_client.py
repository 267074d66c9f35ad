"""Small HTTP helpers for tests that talk to instances over their query port."""

from __future__ import annotations

import http.client
import json
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

DEADLINE_SECONDS = 30


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class Response:
    status: int
    text: str

    def json(self) -> Any:
        return json.loads(self.text)


def http_get(address: str, path: str) -> Response:
    """GET; a refused connection (not listening yet) is status 0."""
    host, _, port = address.rpartition(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=10)
    try:
        connection.request("GET", path)
        response = connection.getresponse()
        return Response(response.status, response.read().decode())
    except ConnectionRefusedError:
        return Response(0, "")
    finally:
        connection.close()


def wait_for(what: str, condition: Callable[[], bool], timeout: float = DEADLINE_SECONDS) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not true after {timeout} s")
        time.sleep(0.02)

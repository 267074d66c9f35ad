"""A plain HTTP GET for tests that talk to instances over their query port."""

from __future__ import annotations

import http.client
import json
import urllib.parse
from dataclasses import dataclass, field
from typing import Any

TIMEOUT_SECONDS = 10


@dataclass
class Response:
    status: int
    text: str
    headers: dict[str, str] = field(default_factory=dict)

    def json(self) -> Any:
        return json.loads(self.text)


def http_get(
    address: str, path: str, *, timeout: float = TIMEOUT_SECONDS, **query: str
) -> Response:
    """GET ``path`` (``query`` as its query string) from ``host:port``.

    No answer (refused, reset or timed out: nothing listening yet, or any more,
    or a stopped process) is status 0 with the error as text, so a test can wait
    for a server to come up or go away.
    """
    host, _, port = address.rpartition(":")
    target = path + ("?" + urllib.parse.urlencode(query) if query else "")
    connection = http.client.HTTPConnection(host, int(port), timeout=timeout)
    try:
        connection.request("GET", target)
        response = connection.getresponse()
        return Response(response.status, response.read().decode(), dict(response.headers))
    except OSError as error:
        return Response(0, str(error))
    finally:
        connection.close()

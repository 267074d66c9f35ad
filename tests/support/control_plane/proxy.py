"""The Service proxy stand-in: each ClusterIP Service's address forwards TCP to a ready pod.

Pods live on loopback addresses, which the API server refuses in Endpoints and EndpointSlices
(so those controllers are off, docs/operator.md): like kube-proxy, this reads which pods back
a Service, but from the pods themselves (selector, Ready condition, podIP, named target
port). Service VIPs come from a loopback range (``127.96.0.0/16``) so it can listen on them.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import threading
from typing import Any

from tests.support.control_plane.client import Client, Informer
from tests.support.control_plane.pods import Obj, container_port


class ServiceProxy:
    def __init__(self, client: Client) -> None:
        self.services = Informer(client, "/api/v1/services")
        self.pods = Informer(client, "/api/v1/pods")
        self.loop = asyncio.new_event_loop()
        self.listeners: dict[tuple[str, int], asyncio.AbstractServer] = {}
        self._round_robin = 0
        self._thread = threading.Thread(target=self.loop.run_forever, name="proxy", daemon=True)
        self._task: Any = None

    def start(self) -> ServiceProxy:
        self.services.start()
        self.pods.start()
        self._thread.start()
        self._task = asyncio.run_coroutine_threadsafe(self._run(), self.loop)
        return self

    def stop(self) -> None:
        self.services.stop()
        self.pods.stop()

        async def close() -> None:
            if self._task is not None:
                self._task.cancel()
            for server in self.listeners.values():
                server.close()
                await server.wait_closed()

        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(close(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)
        if not self.loop.is_running():
            self.loop.close()

    async def _run(self) -> None:
        while True:
            wanted = set()
            for service in self.services.items():
                spec = service["spec"]
                address = spec.get("clusterIP")
                if not address or address == "None" or not spec.get("selector"):
                    continue
                for port in spec.get("ports", []):
                    wanted.add((address, int(port["port"])))
            for key in [k for k in self.listeners if k not in wanted]:
                self.listeners.pop(key).close()
            for key in wanted - set(self.listeners):
                with contextlib.suppress(OSError):
                    self.listeners[key] = await asyncio.start_server(
                        functools.partial(self._forward, key), key[0], key[1]
                    )
            await asyncio.sleep(0.3)

    def endpoints(self, address: str, port: int) -> list[tuple[str, int]]:
        """The ready pods behind a Service port (every pod with an IP, under
        ``publishNotReadyAddresses``), as (pod IP, container port)."""
        service = next(
            (s for s in self.services.items() if s["spec"].get("clusterIP") == address), None
        )
        if service is None:
            return []
        spec = service["spec"]
        target = next(
            (p.get("targetPort", p["port"]) for p in spec["ports"] if p["port"] == port), port
        )
        result = []
        for pod in self.pods.items():
            if pod["metadata"]["namespace"] != service["metadata"]["namespace"]:
                continue
            labels = pod["metadata"].get("labels", {})
            if any(labels.get(k) != v for k, v in spec["selector"].items()):
                continue
            # As the EndpointSlice controller: publishNotReadyAddresses puts every pod
            # with an IP behind the Service, terminating ones included (includeTerminating),
            # whatever its Ready condition says.
            if not spec.get("publishNotReadyAddresses") and (
                pod["metadata"].get("deletionTimestamp") or not _ready(pod)
            ):
                continue
            if pod.get("status", {}).get("phase") in ("Succeeded", "Failed"):
                continue
            ip = pod.get("status", {}).get("podIP")
            number = next(
                (
                    found
                    for c in pod["spec"].get("containers", [])
                    if (found := container_port(c, target))
                ),
                None,
            )
            if ip and number:
                result.append((ip, number))
        return result

    async def _forward(
        self, key: tuple[str, int], reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        endpoints = self.endpoints(*key)
        if not endpoints:
            writer.close()  # kube-proxy rejects the connection when no pod is ready
            return
        self._round_robin += 1
        host, port = endpoints[self._round_robin % len(endpoints)]
        try:
            upstream_reader, upstream_writer = await asyncio.open_connection(host, port)
        except OSError:
            writer.close()
            return

        async def pipe(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
            try:
                while data := await source.read(65536):
                    sink.write(data)
                    await sink.drain()
            except (ConnectionError, asyncio.CancelledError):
                pass
            finally:
                with contextlib.suppress(Exception):
                    sink.close()

        await asyncio.gather(pipe(reader, upstream_writer), pipe(upstream_reader, writer))


def _ready(pod: Obj) -> bool:
    conditions = pod.get("status", {}).get("conditions", [])
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)

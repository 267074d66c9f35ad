"""The security contexts every pod the operator makes runs under: the app's pods and its
restore Jobs' pods alike, so a namespace enforcing Pod Security ``restricted`` admits both."""

from __future__ import annotations

from typing import Any

Obj = dict[str, Any]

# The image's non-root user (Dockerfile: useradd --uid 10001).
RUNTIME_UID = 10001


def pod_security_context() -> Obj:
    return {
        "runAsNonRoot": True,
        "runAsUser": RUNTIME_UID,
        "runAsGroup": RUNTIME_UID,
        "fsGroup": RUNTIME_UID,
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def container_security_context() -> Obj:
    # A read-only root: every path a container writes is a mounted volume (/tmp included).
    return {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
    }

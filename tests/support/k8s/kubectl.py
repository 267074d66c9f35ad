"""Run the machine's real ``kubectl`` against the emulator, isolated per test.

The dispatcher on PATH picks its client from the server's ``/version`` (1.32 here). Each
``Kubectl`` has its own ``HOME`` and ``KUBECONFIG``, so discovery caches never leak between
tests, and nothing here passes ``--validate=false`` or picks an output format for the user:
tests read what a user reads.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from tests.support.k8s.apiserver import ApiServer

KUBECTL = shutil.which("kubectl")


class KubectlError(AssertionError):
    """kubectl exited non-zero where the test expected success."""


class Kubectl:
    def __init__(self, server: ApiServer, home: Path) -> None:
        home.mkdir(parents=True, exist_ok=True)
        self.kubeconfig = home / "kubeconfig"
        self.kubeconfig.write_text(server.kubeconfig(), encoding="utf-8")
        self.env = {
            "PATH": os.environ.get("PATH", ""),
            "HOME": str(home),
            "KUBECONFIG": str(self.kubeconfig),
        }

    def run(
        self, *args: str, stdin: str | None = None, timeout: float = 60
    ) -> subprocess.CompletedProcess[str]:
        if KUBECTL is None:
            raise RuntimeError("kubectl is not on PATH")
        return subprocess.run(
            [KUBECTL, *args],
            input=stdin,
            capture_output=True,
            text=True,
            env=self.env,
            timeout=timeout,
            check=False,
        )

    def __call__(self, *args: str, stdin: str | None = None, timeout: float = 60) -> str:
        """kubectl's stdout; raises with its stderr when it fails."""
        result = self.run(*args, stdin=stdin, timeout=timeout)
        if result.returncode != 0:
            raise KubectlError(
                f"kubectl {' '.join(args)} exited {result.returncode}:\n{result.stderr}"
            )
        return result.stdout

    def fails(self, *args: str, stdin: str | None = None) -> str:
        """kubectl's stderr; raises when it succeeds."""
        result = self.run(*args, stdin=stdin)
        if result.returncode == 0:
            raise AssertionError(f"kubectl {' '.join(args)} succeeded:\n{result.stdout}")
        return result.stderr

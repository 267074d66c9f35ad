"""The control plane's certificates: one CA, serving and client certificates, the SA key pair.

Made with the ``openssl`` command (every Debian image has it), so the harness needs no Python
cryptography package. Identities follow Kubernetes' conventions: a client certificate's CN is
the user and each O a group (``system:node:<name>`` in ``system:nodes`` for a kubelet).
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

# Long enough for any test run or `make cluster` session; the directory is thrown away after.
_DAYS = "30"


class Pki:
    """Certificates under ``root``, created once (a restarted control plane reuses them)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.ca_cert = root / "ca.crt"
        self.ca_key = root / "ca.key"
        self.sa_key = root / "sa.key"
        self.sa_pub = root / "sa.pub"

    def create(self, *, server_addresses: list[str]) -> Pki:
        if shutil.which("openssl") is None:
            raise RuntimeError(
                "the control plane needs the `openssl` command for its certificates: "
                "install Debian's openssl package"
            )
        self.root.mkdir(parents=True, exist_ok=True)
        if not self.ca_cert.exists():
            _openssl(
                "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", _DAYS,
                "-keyout", str(self.ca_key), "-out", str(self.ca_cert),
                "-subj", "/CN=eddyline-test-ca",
                "-addext", "basicConstraints=critical,CA:TRUE",
                "-addext", "keyUsage=critical,keyCertSign,cRLSign,digitalSignature",
            )  # fmt: skip
        if not self.sa_key.exists():
            _openssl("genrsa", "-out", str(self.sa_key), "2048")
            _openssl("rsa", "-in", str(self.sa_key), "-pubout", "-out", str(self.sa_pub))
        names = ["localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc"]
        alt = ",".join([*(f"DNS:{n}" for n in names), *(f"IP:{a}" for a in server_addresses)])
        self.certificate("apiserver", "kube-apiserver", [], server_alt_names=alt)
        return self

    def certificate(
        self, name: str, user: str, groups: list[str], *, server_alt_names: str = ""
    ) -> tuple[Path, Path]:
        """A key and a certificate signed by the CA: (cert, key); reused when present."""
        cert, key, request = (
            self.root / f"{name}.crt",
            self.root / f"{name}.key",
            self.root / f"{name}.csr",
        )
        if cert.exists() and key.exists():
            return cert, key
        subject = "".join(f"/O={group}" for group in groups) + f"/CN={user}"
        _openssl(
            "req", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(request),
            "-subj", subject,
        )  # fmt: skip
        extensions = self.root / f"{name}.ext"
        usage = "serverAuth" if server_alt_names else "clientAuth"
        lines = [
            "basicConstraints=CA:FALSE",
            "keyUsage=critical,digitalSignature,keyEncipherment",
            f"extendedKeyUsage={usage}",
        ]
        if server_alt_names:
            lines.append(f"subjectAltName={server_alt_names}")
        extensions.write_text("\n".join(lines) + "\n", encoding="utf-8")
        _openssl(
            "x509", "-req", "-in", str(request), "-CA", str(self.ca_cert),
            "-CAkey", str(self.ca_key), "-CAcreateserial", "-days", _DAYS,
            "-extfile", str(extensions), "-out", str(cert),
        )  # fmt: skip
        request.unlink()
        return cert, key


def _openssl(*args: str) -> None:
    completed = subprocess.run(
        ["openssl", *args], capture_output=True, text=True, check=False, timeout=60
    )
    if completed.returncode != 0:
        raise RuntimeError(f"openssl {args[0]} failed:\n{completed.stderr}")

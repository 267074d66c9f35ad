"""The images the real nodes need before any eddyline image exists: pause, busybox, CoreDNS.

No registry is reachable from the project's machines, so all are built here, without a
container engine: an image is a Docker image archive (``manifest.json``, a config, one
uncompressed layer) written by :func:`write_archive` and imported into each node's
containerd with ``ctr images import``. The pause image holds the project's own
``tools/pause/pause.c`` compiled with ``gcc -static``; the busybox image holds Debian's
``busybox-static`` and the links the tests' pods call; the CoreDNS image its static binary.
Archives are cached under ``.cache/realnode/`` by a hash of what went into them, so a second
run only imports.

Names start with ``localhost/``: a node asked to pull one (a missing import) looks on this
machine only, never on a registry outside it.
"""

from __future__ import annotations

import hashlib
import io
import json
import shutil
import subprocess
import tarfile
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
CACHE = REPO / ".cache" / "realnode"
PAUSE_SOURCE = REPO / "tools" / "pause" / "pause.c"
BUSYBOX = Path("/bin/busybox")
# The applets the tests' pods run: sh for commands and exec probes, wget (with ssl_client for
# HTTPS) to reach the API server and Services, httpd to serve behind a Service, tail to fill
# memory (`tail /dev/zero` buffers a line that never ends), nslookup to ask the cluster DNS.
BUSYBOX_APPLETS = (
    "sh", "sleep", "cat", "wget", "ssl_client", "httpd", "tail", "nslookup", "ls", "id", "true",
)  # fmt: skip
# Bumped when the layout of an archive changes, so cached archives of the old layout go.
_FORMAT = "1"


@dataclass(frozen=True)
class Image:
    """An image archive on disk and the reference it is imported as."""

    reference: str
    archive: Path


def pause_image() -> Image:
    """The sandbox image every node's containerd names in its CRI ``sandbox_image``."""
    if shutil.which("gcc") is None:
        raise RuntimeError(
            "the pause image is compiled from tools/pause/pause.c: install Debian's gcc "
            "(and libc6-dev for the static C library)"
        )
    source = PAUSE_SOURCE.read_bytes()
    digest = _digest(source)
    reference = f"localhost/eddyline-test/pause:{digest}"
    archive = CACHE / f"pause-{digest}.tar"
    if not archive.exists():
        build = CACHE / f"pause-{digest}.build"
        build.mkdir(parents=True, exist_ok=True)
        binary = build / "pause"
        completed = subprocess.run(
            ["gcc", "-static", "-Os", "-s", "-o", str(binary), str(PAUSE_SOURCE)],
            capture_output=True, text=True, check=False, timeout=120,
        )  # fmt: skip
        if completed.returncode != 0:
            raise RuntimeError(
                f"gcc -static tools/pause/pause.c failed (a static build needs Debian's "
                f"libc6-dev):\n{completed.stderr}"
            )
        write_archive(
            archive,
            reference,
            files={"pause": binary.read_bytes()},
            executables={"pause"},
            entrypoint=["/pause"],
        )
        shutil.rmtree(build)
    return Image(reference, archive)


def busybox_image() -> Image:
    """A shell and a few tools, ``FROM scratch``: what the tests' own pods run."""
    if not BUSYBOX.exists():
        raise RuntimeError(
            f"the tests' pod image copies {BUSYBOX}: install Debian's busybox-static"
        )
    binary = BUSYBOX.read_bytes()
    digest = _digest(binary, " ".join(BUSYBOX_APPLETS).encode())
    reference = f"localhost/eddyline-test/busybox:{digest}"
    archive = CACHE / f"busybox-{digest}.tar"
    if not archive.exists():
        write_archive(
            archive,
            reference,
            files={"bin/busybox": binary},
            executables={"bin/busybox"},
            links={f"bin/{applet}": "busybox" for applet in BUSYBOX_APPLETS},
            entrypoint=["/bin/sh"],
        )
    return Image(reference, archive)


def coredns_image(binary: Path) -> Image:
    """CoreDNS (built static by ``scripts/build-control-plane --node``), ``FROM scratch``."""
    content = binary.read_bytes()
    digest = _digest(content)
    reference = f"localhost/eddyline-test/coredns:{digest}"
    archive = CACHE / f"coredns-{digest}.tar"
    if not archive.exists():
        write_archive(
            archive,
            reference,
            files={"coredns": content},
            executables={"coredns"},
            entrypoint=["/coredns"],
        )
    return Image(reference, archive)


def write_archive(
    path: Path,
    reference: str,
    *,
    files: dict[str, bytes],
    executables: set[str],
    entrypoint: list[str],
    links: dict[str, str] | None = None,
) -> None:
    """A Docker image archive of one layer holding ``files`` (and symbolic ``links``).

    Written to a temporary name first, so an interrupted run never leaves an archive that a
    later run would import as complete.
    """
    layer = io.BytesIO()
    with tarfile.open(fileobj=layer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        directories = sorted(
            {str(parent) for name in [*files, *(links or {})] for parent in Path(name).parents}
            - {"."}
        )
        for directory in directories:
            tar.addfile(_entry(directory, tarfile.DIRTYPE, 0o755))
        for name, content in sorted(files.items()):
            entry = _entry(name, tarfile.REGTYPE, 0o755 if name in executables else 0o644)
            entry.size = len(content)
            tar.addfile(entry, io.BytesIO(content))
        for name, target in sorted((links or {}).items()):
            entry = _entry(name, tarfile.SYMTYPE, 0o777)
            entry.linkname = target
            tar.addfile(entry)
    layer_bytes = layer.getvalue()
    diff_id = "sha256:" + hashlib.sha256(layer_bytes).hexdigest()
    config = json.dumps(
        {
            "architecture": "amd64",
            "os": "linux",
            "config": {"Entrypoint": entrypoint, "Env": ["PATH=/bin"]},
            "rootfs": {"type": "layers", "diff_ids": [diff_id]},
        },
        sort_keys=True,
    ).encode()
    config_name = hashlib.sha256(config).hexdigest() + ".json"
    layer_name = diff_id.removeprefix("sha256:") + "/layer.tar"
    manifest = json.dumps(
        [{"Config": config_name, "RepoTags": [reference], "Layers": [layer_name]}]
    ).encode()
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".partial")
    with tarfile.open(partial, mode="w", format=tarfile.PAX_FORMAT) as archive:
        for name, content in (
            (config_name, config),
            (layer_name, layer_bytes),
            ("manifest.json", manifest),
        ):
            entry = tarfile.TarInfo(name)
            entry.size = len(content)
            archive.addfile(entry, io.BytesIO(content))
    partial.replace(path)


def _entry(name: str, kind: bytes, mode: int) -> tarfile.TarInfo:
    entry = tarfile.TarInfo(name)
    entry.type = kind
    entry.mode = mode
    return entry


def _digest(*parts: bytes) -> str:
    hasher = hashlib.sha256(_FORMAT.encode())
    for part in parts:
        hasher.update(hashlib.sha256(part).digest())
    # Twelve hex digits name an image as Docker's short IDs do; collisions are not a concern
    # among the handful of archives one cache holds.
    return hasher.hexdigest()[:12]

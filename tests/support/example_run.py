"""An example app run as a user runs it: ``eddyline run MANIFEST`` in a process of its own.

The example's topology module and manifest are copied into a directory, the
manifest pointed at a log and a state directory there and at a query address;
the process writes its stderr to a file, is terminated (then killed) at the
end, and must not have printed a traceback.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import yaml

from tests.support.ports import free_port

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@dataclass
class ExampleRun:
    process: subprocess.Popen[bytes]
    address: str  # host:port of its query server
    stderr: Path

    def output(self) -> str:
        return self.stderr.read_text(errors="replace")


def example_manifest(directory: Path, example: str, module: str) -> tuple[Path, str]:
    """Copy ``examples/<example>`` into ``directory``, pointed at a log, state and a free port
    there; returns the manifest and the query address."""
    source = EXAMPLES / example
    shutil.copy(source / f"{module}.py", directory / f"{module}.py")
    document = yaml.safe_load((source / "streamapp.yaml").read_text(encoding="utf-8"))
    document["spec"]["log"]["url"] = f"sqlite:///{directory / 'log.db'}"
    document["spec"]["config"]["state.dir"] = str(directory / "state")
    address = f"127.0.0.1:{free_port()}"
    document["spec"]["config"]["application.server"] = address
    manifest = directory / "streamapp.yaml"
    manifest.write_text(yaml.safe_dump(document), encoding="utf-8")
    return manifest, address


@contextlib.contextmanager
def eddyline_run(
    manifest: Path, address: str, *, preexec_fn: Callable[[], None] | None = None
) -> Iterator[ExampleRun]:
    environment = {k: v for k, v in os.environ.items() if not k.startswith("EDDYLINE")}
    stderr_path = manifest.parent / "stderr.txt"
    with stderr_path.open("wb") as stderr:
        process = subprocess.Popen(
            [sys.executable, "-m", "eddyline_runtime.cli", "run", str(manifest)],
            cwd=manifest.parent,
            env=environment,
            stdout=subprocess.DEVNULL,
            stderr=stderr,
            preexec_fn=preexec_fn,  # noqa: PLW1509 (the test process starts no threads first)
        )
    run = ExampleRun(process, address, stderr_path)
    try:
        yield run
        assert process.poll() is None, run.output()[-3000:]
    finally:
        process.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(30)
        if process.poll() is None:
            process.kill()
            process.wait()
    assert "Traceback" not in run.output(), run.output()[-3000:]

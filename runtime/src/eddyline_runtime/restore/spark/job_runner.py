"""``eddyline restore job``: what a restore Job's pod runs.

It runs the build through ``spark-submit`` in client mode (the driver is this
pod; with a ``k8s://`` master the executors are pods owned by it, named after
it through ``spark.kubernetes.driver.pod.name``), then judges the result
itself: the driver's exit status **and** the manifests the build wrote, every
requested partition's, readable and naming files that exist. spark-submit
can exit 0 for a driver that failed, and a driver can exit 0 having written
less than asked. The verdict (:class:`~eddyline_runtime.restore.job_result.JobResult`)
goes to the shared claim, where waiting tasks read it, and to the
termination message, where the operator reads it; the exit code follows it.
"""

from __future__ import annotations

import collections
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Final

from eddyline_runtime.restore.job_result import JobResult, JobState, write_job_result
from eddyline_runtime.restore.manifest import ManifestError, manifest_name, read_manifest

# The driver program spark-submit runs: `eddyline restore build` inside Spark's launcher
# (eddyline_runtime/restore_driver.py, a file beside the CLI, which it calls).
DRIVER_SCRIPT: Final = Path(__file__).parents[2] / "restore_driver.py"
# Kubernetes keeps at most 4096 bytes of a termination message.
_TERMINATION_MESSAGE_BYTES: Final = 4096
# The driver's last lines of output kept to say why it failed.
_KEPT_LINES: Final = 400
# Lines of a failed driver's output that say why, most telling first: the API server
# refusing the Job's identity (its RoleBinding gone), the API server or a broker out of
# reach, then Spark's own errors.
_REASONS: Final = (
    re.compile(r"(?:\w+ \"[^\"]*\" )?is forbidden: .*"),
    re.compile(r"(?:java\.net\.)?UnknownHostException: .*"),
    re.compile(r"(?:java\.net\.)?(?:ConnectException|NoRouteToHostException): .*"),
    # An address that drops every packet: fabric8's Vert.x client gives up after
    # spark.kubernetes.driver.connectionTimeout and names the address ("The timeout of 10000 ms
    # has been exceeded when getting a connection to <host>:<port>", Spark 4.2); Netty's and
    # the JDK's own timeouts end in TimeoutException too. Before Spark's own line, which says
    # only "External scheduler cannot be instantiated".
    re.compile(r"(?:[\w$]+\.)*\w*TimeoutException: .*"),
    re.compile(r"(?:Spark|KubernetesClient)Exception: .*"),
)
_REASON_CHARACTERS: Final = 600


def spark_submit_command(
    *,
    manifest: Path,
    store: str,
    partitions: Sequence[int],
    output: Path,
    master: str,
    conf: Mapping[str, str],
    spark_submit: str,
    log_url: str | None = None,
) -> list[str]:
    """spark-submit in client mode running the build driver."""
    command = [spark_submit, "--master", master, "--deploy-mode", "client"]
    command += ["--name", f"eddyline-restore-{store}"]
    for key, value in sorted(conf.items()):
        command += ["--conf", f"{key}={value}"]
    command += [str(DRIVER_SCRIPT), "--manifest", str(manifest), "--store", store]
    command += ["--partitions", ",".join(str(p) for p in partitions)]
    command += ["--output", str(output), "--master", master]
    if log_url is not None:
        command += ["--log-url", log_url]
    for key, value in sorted(conf.items()):
        command += ["--conf", f"{key}={value}"]
    return command


def find_spark_submit() -> str | None:
    """spark-submit on PATH, else the one inside the installed pyspark package."""
    found = shutil.which("spark-submit")
    if found is not None:
        return found
    try:
        import importlib.util

        spec = importlib.util.find_spec("pyspark")
    except (ImportError, ValueError):
        return None
    if spec is None or spec.origin is None:
        return None
    candidate = Path(spec.origin).parent / "bin" / "spark-submit"
    return str(candidate) if candidate.exists() else None


def build_directories(output: Path, application: str, store: str) -> set[str]:
    root = output / application / store
    if not root.is_dir():
        return set()
    return {entry.name for entry in root.iterdir() if entry.is_dir() and entry.name[0].isdigit()}


def judge_build(
    output: Path,
    *,
    application: str,
    store: str,
    partitions: Sequence[int],
    before: set[str],
    driver_exit_code: int,
    driver_error: str | None = None,
    master: str | None = None,
) -> JobResult:
    """The Job's verdict from the driver's exit status and the manifests on disk.

    Success needs a zero exit status and one new build directory holding a
    readable manifest for every requested partition whose files all exist.
    ``driver_error`` is why a failed driver failed, as its output says (:func:`driver_reason`);
    ``master``, when given, is named beside it: an error about an address reads clearly only
    next to the API server the driver was told to use.
    """

    def failed(message: str, build_id: str | None = None) -> JobResult:
        return JobResult(
            state=JobState.FAILED,
            application=application,
            store=store,
            partitions=tuple(partitions),
            build_id=build_id,
            driver_exit_code=driver_exit_code,
            message=message,
        )

    new = sorted(build_directories(output, application, store) - before)
    if driver_exit_code != 0:
        why = f": {driver_error}" if driver_error else ""
        where = f" (master {master})" if master else ""
        return failed(f"the Spark driver{where} exited with status {driver_exit_code}{why}")
    if not new:
        return failed("the driver exited 0 but wrote no build directory")
    build_id = new[-1]
    directory = output / application / store / build_id
    offsets: dict[int, int] = {}
    for partition in partitions:
        path = directory / manifest_name(partition)
        if not path.is_file():
            return failed(f"the driver exited 0 but wrote no manifest for partition {partition}")
        try:
            manifest = read_manifest(path)
        except ManifestError as error:
            return failed(str(error), build_id)
        missing = [f.name for f in manifest.files if not (directory / f.name).is_file()]
        if missing:
            return failed(f"manifest {path} names missing files {missing}", build_id)
        offsets[partition] = manifest.offset
    return JobResult(
        state=JobState.SUCCEEDED,
        application=application,
        store=store,
        partitions=tuple(partitions),
        build_id=build_id,
        offsets=offsets,
        driver_exit_code=0,
        message=f"{len(offsets)} manifests in {directory}",
    )


def driver_reason(lines: Iterable[str]) -> str | None:
    """The line of a failed driver's output that says why (the first match of the most
    telling pattern), or None."""
    kept = list(lines)
    for pattern in _REASONS:
        for line in kept:
            found = pattern.search(line)
            if found is not None:
                return found.group(0).strip()[:_REASON_CHARACTERS]
    return None


def _run_driver(command: Sequence[str], env: Mapping[str, str]) -> tuple[int, str | None]:
    """spark-submit, its output passed on to this process's stderr (the pod's log) and its
    last lines kept to say why it failed."""
    tail: collections.deque[str] = collections.deque(maxlen=_KEPT_LINES)
    with subprocess.Popen(
        command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        errors="replace",
    ) as driver:  # fmt: skip
        assert driver.stdout is not None
        for line in driver.stdout:
            sys.stderr.write(line)
            tail.append(line)
        code = driver.wait()
    return code, (driver_reason(tail) if code != 0 else None)


def run_restore_job(
    *,
    manifest: Path,
    application: str,
    store: str,
    partitions: Sequence[int],
    output: Path,
    master: str,
    conf: Mapping[str, str],
    job_name: str,
    result_file: Path | None,
    log_url: str | None = None,
) -> JobResult:
    """Run the build with spark-submit, judge it, and publish the verdict."""
    before = build_directories(output, application, store)
    spark_submit = find_spark_submit()
    if spark_submit is None:
        result = JobResult(
            state=JobState.FAILED,
            application=application,
            store=store,
            partitions=tuple(partitions),
            message="spark-submit not found: run the Job in the restore image "
            "(restore.Dockerfile) or pip install 'eddyline[spark]'",
        )
    else:
        command = spark_submit_command(
            manifest=manifest,
            store=store,
            partitions=partitions,
            output=output,
            master=master,
            conf=conf,
            spark_submit=spark_submit,
            log_url=log_url,
        )
        env = dict(os.environ)
        # The driver and the Python workers must be this interpreter (it has eddyline).
        env.setdefault("PYSPARK_PYTHON", sys.executable)
        env.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
        if master.startswith("local"):
            env.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
        code, reason = _run_driver(command, env)
        result = judge_build(
            output,
            application=application,
            store=store,
            partitions=partitions,
            before=before,
            driver_exit_code=code,
            driver_error=reason,
            master=master,
        )
    write_job_result(output, job_name, result)
    if result_file is not None:
        text = result.to_text().encode()[:_TERMINATION_MESSAGE_BYTES]
        result_file.parent.mkdir(parents=True, exist_ok=True)
        result_file.write_bytes(text)
    return result

"""``eddyline restore executor``: what a Spark executor pod of a restore Job runs.

With a ``k8s://`` master, the driver (the restore Job's pod) creates executor pods from the
restore image and gives their container the single argument ``executor``; the image's
entrypoint is ``eddyline restore``, so this is what starts. Spark's own images answer that
argument with a shell entrypoint (``entrypoint.sh``) that the PySpark wheel does not ship;
this does the same job in Python: it reads the settings Spark passes in the environment and
replaces itself with the executor's JVM (``KubernetesExecutorBackend``), which connects back
to the driver. The JVM becomes the container's first process, so the kubelet's SIGTERM
reaches it directly.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Final, NoReturn

from eddyline_runtime.errors import EddylineError

# The class Spark's own executor images start (Spark 3.4+): it reports its pod name to the
# driver, which then matches the executor to the pod it created.
BACKEND_CLASS: Final = "org.apache.spark.scheduler.cluster.k8s.KubernetesExecutorBackend"
# Environment variables the driver sets on every executor container, and the backend
# argument each one becomes.
_ARGUMENTS: Final = (
    ("--driver-url", "SPARK_DRIVER_URL"),
    ("--executor-id", "SPARK_EXECUTOR_ID"),
    ("--cores", "SPARK_EXECUTOR_CORES"),
    ("--app-id", "SPARK_APPLICATION_ID"),
    ("--hostname", "SPARK_EXECUTOR_POD_IP"),
    ("--resourceProfileId", "SPARK_RESOURCE_PROFILE_ID"),
    ("--podName", "SPARK_EXECUTOR_POD_NAME"),
)
# The driver passes the executor's JVM options as SPARK_JAVA_OPT_0, _1, ... in this order.
_JAVA_OPT: Final = re.compile(r"SPARK_JAVA_OPT_(\d+)")


class ExecutorStartError(EddylineError):
    """An executor container that lacks what the driver should have given it."""


def spark_home() -> Path:
    """The installed PySpark package: a pip-installed Spark's home (``jars/``, ``conf/``).
    Found, not imported: the process becomes a JVM at once."""
    spec = importlib.util.find_spec("pyspark")
    if spec is None or spec.origin is None:
        raise ExecutorStartError(
            "restore executor: PySpark is not installed: run executors from the restore image "
            "(restore.Dockerfile)"
        )
    return Path(spec.origin).parent


def executor_command(env: Mapping[str, str], *, home: Path, java: str | None = None) -> list[str]:
    """The executor JVM's command line from the environment the driver gave the pod."""
    missing = [name for _, name in _ARGUMENTS if not env.get(name)]
    missing += [] if env.get("SPARK_EXECUTOR_MEMORY") else ["SPARK_EXECUTOR_MEMORY"]
    if missing:
        raise ExecutorStartError(
            f"restore executor: {', '.join(missing)} not set; this command runs inside an "
            "executor pod a Spark driver created (spec.restore.master k8s://...), not by hand"
        )
    java = java or _java(env)
    options = sorted(
        ((int(found.group(1)), value) for name, value in env.items()
         if (found := _JAVA_OPT.fullmatch(name))),
    )  # fmt: skip
    classpath = [str(home / "conf"), str(home / "jars" / "*")]
    classpath += [
        part for part in (env.get("SPARK_EXTRA_CLASSPATH"), env.get("SPARK_CLASSPATH")) if part
    ]
    memory = env["SPARK_EXECUTOR_MEMORY"]
    command = [java, *(value for _, value in options), f"-Xms{memory}", f"-Xmx{memory}"]
    command += ["-cp", ":".join(classpath), BACKEND_CLASS]
    for flag, name in _ARGUMENTS:
        command += [flag, env[name]]
    return command


def _java(env: Mapping[str, str]) -> str:
    home = env.get("JAVA_HOME")
    if home and (Path(home) / "bin" / "java").exists():
        return str(Path(home) / "bin" / "java")
    found = shutil.which("java", path=env.get("PATH"))
    if found is None:
        raise ExecutorStartError(
            "restore executor: no java on PATH and no JAVA_HOME: run executors from the "
            "restore image (restore.Dockerfile), which has a JRE"
        )
    return found


def exec_executor() -> NoReturn:
    """Replace this process with the executor JVM (never returns)."""
    home = spark_home()
    command = executor_command(os.environ, home=home)
    env = dict(os.environ)
    # Spark's launcher scripts look for SPARK_HOME; the Python workers the JVM starts use it
    # to find PySpark's files.
    env.setdefault("SPARK_HOME", str(home))
    os.execve(command[0], command, env)

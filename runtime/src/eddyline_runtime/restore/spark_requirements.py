"""What a command that starts Spark needs on this machine, and the one message when
it is missing (``eddyline restore build`` and ``eddyline backfill build`` both say it).

No Spark import here: the check runs before anything imports ``pyspark``.
"""

from __future__ import annotations

import os
import shutil


def spark_missing(command: str) -> str:
    """The error for ``command`` (e.g. ``"restore build"``) when PySpark or Java is absent."""
    return (
        f"{command} needs PySpark and a Java 17+ runtime: pip install 'eddyline[spark]' and "
        "install a JRE (e.g. apt-get install openjdk-17-jre-headless), or run it in the "
        "restore image"
    )


def java_missing() -> bool:
    """No ``java`` on PATH and no JAVA_HOME: PySpark's JVM cannot start."""
    return shutil.which("java") is None and not os.environ.get("JAVA_HOME")

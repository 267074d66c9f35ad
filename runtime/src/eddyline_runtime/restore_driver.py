"""The program spark-submit runs in a restore Job: ``eddyline restore build`` with its arguments.

spark-submit takes a Python file, not a console script; this file is that
program (:mod:`eddyline_runtime.restore.spark.job_runner` passes its path to spark-submit). Its
exit status is the driver's.
"""

from __future__ import annotations

import sys

if __name__ == "__main__":
    from eddyline_runtime.cli import main

    sys.exit(main(["restore", "build", *sys.argv[1:]]))

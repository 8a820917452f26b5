"""Run several saved python blocks of one page in one process, one after the other.

``python _run_blocks.py NAME...``, in the directory the blocks were saved to: each file
runs as ``python NAME`` would run it (``__name__ == "__main__"``, ``sys.argv == [NAME]``,
that directory first on ``sys.path``), in the process's environment. (A crash point armed
for one program is armed in the environment of the whole process, filtered by its sink id:
the Python workers that Spark's JVM starts, where the DataSource form's driver-side calls
run, inherit the environment the JVM was started with.) Each block is framed on stdout by a
start line and an end line with its seconds, so that the test can tell what each block
printed and which blocks finished before a SIGKILL.

Why one process: a program of the docs starts a Spark driver JVM (10-15 s of CPU on the CI
machine); after its ``spark.stop()`` the next program's ``get_session`` starts a new
SparkContext in the same JVM. PySpark keeps the JVM and its class path for the process: the
first program that starts Spark must ask for the widest ``components`` (the test orders
the blocks so), or ``get_session`` refuses (``check_components``).
"""

from __future__ import annotations

import os
import runpy
import sys
import time

START = "@@docs-block-start"
END = "@@docs-block-end"


def main(names: list[str]) -> int:
    sys.path[0] = os.getcwd()  # as `python NAME.py` in that directory
    for name in names:
        print(f"{START} {name}", flush=True)
        print(f"{START} {name}", file=sys.stderr, flush=True)
        started = time.monotonic()
        sys.argv = [name]
        runpy.run_path(name, run_name="__main__")
        sys.stdout.flush()
        print(f"{END} {name} {time.monotonic() - started:.1f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

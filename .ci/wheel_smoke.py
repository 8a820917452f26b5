"""The installed wheel, run from outside the repository: a short PostgresSink streaming query.

CI's wheel lane copies this file into an empty directory and runs it with the clean virtual
environment's Python (the package installed from the wheel, no repository on ``sys.path``).
Input: JSON files, one micro-batch each, ``Trigger.AvailableNow``; output checked id by id:
nothing missing, nothing twice, nothing left prepared.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psycopg

import connectors
from connectors import PostgresSink
from connectors.spark import get_session

FILES, ROWS = 3, 200


def main() -> int:
    repo_hint = os.environ.get("EOS_REPO", "")
    where = Path(connectors.__file__).resolve()
    if "site-packages" not in where.parts or (repo_hint and str(where).startswith(repo_hint)):
        print(f"wheel smoke: connectors imported from {where}, not an installed wheel",
              file=sys.stderr)
        return 1
    conninfo = os.environ["EOS_POSTGRES_CONNINFO"]
    work = Path(tempfile.mkdtemp(prefix="eos-wheel-smoke-"))
    for f in range(FILES):
        rows = [{"id": f * ROWS + i, "name": f"n{f * ROWS + i}"} for i in range(ROWS)]
        (work / "input").mkdir(exist_ok=True)
        (work / "input" / f"part-{f}.json").write_text("\n".join(map(json.dumps, rows)))
    tag = f"{int(time.time())}_{os.getpid()}"
    table = f"public.wheel_smoke_{tag}"
    spark = get_session("wheel-smoke", master="local[2]", components=())
    sink = PostgresSink(conninfo, table, sink_id=f"wheel-smoke-{tag}", create_table=True)
    query = (spark.readStream.schema("id LONG, name STRING").option("maxFilesPerTrigger", 1)
             .json(str(work / "input"))
             .writeStream.foreachBatch(sink)
             .option("checkpointLocation", str(work / "checkpoint"))
             .trigger(availableNow=True).start())
    query.awaitTermination()
    spark.stop()
    with psycopg.connect(conninfo, autocommit=True) as conn:
        ids = [r[0] for r in conn.execute(f"SELECT id FROM {table} ORDER BY id")]  # noqa: S608
    # The operator's view, through the installed console script: nothing left prepared.
    status = subprocess.run(["connectors", "status", "--postgres", conninfo, "--sink-id",
                             sink.sink_id, "--json"], capture_output=True, text=True,
                            check=False)
    (entry,) = json.loads(status.stdout)
    expected = list(range(FILES * ROWS))
    ok = (ids == expected and status.returncode == 0 and entry["lingering"] == []
          and entry["last_committed"] == FILES - 1)
    print(f"wheel smoke: connectors {connectors.__version__} from {where.parent}: "
          f"{len(ids)} rows in {table}, {len(set(ids))} distinct, expected {len(expected)}; "
          f"status exit {status.returncode}, last batch {entry['last_committed']}, "
          f"lingering {len(entry['lingering'])}: {'OK' if ok else 'FAILED'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

"""The ``"s3"`` component against a real S3 API: Delta on ``s3a://``, read back by delta-rs.

Needs an S3 endpoint with a bucket, named by ``EOS_S3_ENDPOINT`` (``http://host:port``),
``EOS_S3_BUCKET``, ``EOS_S3_ACCESS_KEY`` and ``EOS_S3_SECRET_KEY`` (region us-east-1; moto's
server will do: ``moto_server -H 127.0.0.1 -p PORT``, then create the bucket); skips
without them. The first run fetches hadoop-aws and the AWS SDK bundle (650 MB and more)
with Maven. The Spark driver runs in a subprocess: the in-process session of the other
tests has no ``s3`` jars, and one JVM serves one process.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest

from connectors.spark import resolve_jars

pytestmark = pytest.mark.integration

REPO_ROOT = Path(__file__).resolve().parent.parent
REGION = "us-east-1"


@dataclass(frozen=True)
class S3:
    endpoint: str
    bucket: str
    access_key: str
    secret_key: str


@pytest.fixture(scope="module")
def s3() -> S3:
    """The S3 endpoint of ``EOS_S3_*``; the test skips when one of them is unset."""
    names = ("EOS_S3_ENDPOINT", "EOS_S3_BUCKET", "EOS_S3_ACCESS_KEY", "EOS_S3_SECRET_KEY")
    values = [os.environ.get(n, "") for n in names]
    if not all(values):
        pytest.skip(f"no S3 endpoint: set {', '.join(names)}")
    return S3(*values)


DRIVER_SCRIPT = textwrap.dedent(
    """
    import json, logging, sys, time

    # The settings log (DEBUG) goes to stderr: the test checks that no secret is in it.
    logging.basicConfig(stream=sys.stderr, format="%(name)s: %(message)s")
    logging.getLogger("connectors.spark._session").setLevel(logging.DEBUG)

    from connectors.spark import get_session, resolve_jars

    s3 = json.loads(sys.argv[1])
    path = sys.argv[2]
    started = time.monotonic()
    resolve_jars(["delta", "s3"])
    resolved = time.monotonic()
    spark = get_session("s3a-test", components=["delta", "s3"], conf={
        "spark.hadoop.fs.s3a.endpoint": s3["endpoint"],
        "spark.hadoop.fs.s3a.endpoint.region": s3["region"],
        "spark.hadoop.fs.s3a.path.style.access": "true",
        "spark.hadoop.fs.s3a.connection.ssl.enabled": str(
            s3["endpoint"].startswith("https://")).lower(),
        "spark.hadoop.fs.s3a.access.key": s3["access_key"],
        "spark.hadoop.fs.s3a.secret.key": s3["secret_key"],
    })
    session = time.monotonic()
    try:
        spark.range(0, 5).write.format("delta").save(path)
        spark.range(5, 8).write.format("delta").mode("append").save(path)
        spark.range(8, 12).write.format("delta").mode("append").save(path)
        rows = spark.read.format("delta").load(path).orderBy("id").collect()
        history = spark.sql(f"DESCRIBE HISTORY delta.`{path}`").orderBy("version").collect()
        print("RESULT " + json.dumps({
            "ids": [r.id for r in rows],
            "history": [[h.version, h.operation] for h in history],
            "resolve_s": round(resolved - started, 1),
            "session_s": round(session - resolved, 1),
        }))
    finally:
        spark.stop()
    """
)


def test_delta_on_s3a_round_trip_read_back_by_delta_rs(s3: S3) -> None:
    from deltalake import DeltaTable

    resolve_jars(["delta", "s3"])  # fetch outside the subprocess's timeout if needed
    key = f"eos-s3a-{uuid.uuid4().hex[:12]}/t"
    settings = {"endpoint": s3.endpoint, "region": REGION, "access_key": s3.access_key,
                "secret_key": s3.secret_key}
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
    proc = subprocess.run(
        [sys.executable, "-c", DRIVER_SCRIPT, json.dumps(settings), f"s3a://{s3.bucket}/{key}"],
        cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=600, check=False,
    )
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stderr[-5000:]
    result = json.loads(lines[-1][len("RESULT "):])
    print(f"s3a session: jars resolved in {result['resolve_s']} s, session started in "
          f"{result['session_s']} s")

    assert result["ids"] == list(range(12))
    assert result["history"] == [[0, "WRITE"], [1, "WRITE"], [2, "WRITE"]]
    # The settings were logged, the secret not.
    assert "'spark.hadoop.fs.s3a.secret.key': '***'" in proc.stderr
    assert "'spark.hadoop.fs.s3a.access.key': '***'" in proc.stderr
    assert s3.secret_key not in proc.stdout + proc.stderr

    # delta-rs reads the same table through its own S3 client: the log Spark wrote is whole.
    table = DeltaTable(f"s3://{s3.bucket}/{key}", storage_options={
        "AWS_ENDPOINT_URL": s3.endpoint,
        "AWS_ACCESS_KEY_ID": s3.access_key,
        "AWS_SECRET_ACCESS_KEY": s3.secret_key,
        "AWS_REGION": REGION,
        "AWS_ALLOW_HTTP": str(s3.endpoint.startswith("http://")).lower(),
    })
    assert table.version() == 2
    assert sorted(table.to_pyarrow_table().column("id").to_pylist()) == list(range(12))

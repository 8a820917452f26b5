"""MariaDB load paths and Python drivers, side by side: LOAD DATA LOCAL INFILE of the
encoder's bytes against multi-row INSERTs, inside one XA branch (issue 54).

Per driver (``--driver``, repeatable, ``NAME`` or ``NAME=PYTHON`` to run it with another
interpreter: mariadb 1.1 and 2.0 cannot share one environment), per repetition, each case
in a fresh worker process (``--worker``), drivers in a rotating order:

* ``load``: ``--rows`` rows (``id BIGINT, name VARCHAR(64), amount DOUBLE, ts
  DATETIME(6)``, a pyarrow Table) into a fresh InnoDB table: encode
  (``connectors.mariadb._encode``), ``XA START``, ``LOAD DATA LOCAL INFILE`` from an
  in-memory file, the warning count checked, ``XA END``, ``XA PREPARE``, ``XA COMMIT``;
* ``insert``: the same rows through the driver's ``executemany`` (``--chunk`` rows a call:
  the drivers rewrite it into multi-row INSERTs, mariadb into its bulk protocol),
  Arrow -> Python tuples included;
* ``xa``: 20 branches of 100 rows: each XA statement's round trip;
* ``connect``: 10 connects (and ``SELECT 1``) without TLS and 10 with TLS verified
  against the CA.

Each load is checked (count, sum of ids); a wrong table exits 1. Printed: one table of
medians [min-max] over the repetitions, and the machine's 1-min load before and after.

    python -m benchmarks.mariadb_load --driver pymysql --driver mariadb ...  # 500,000 x 3
    python -m benchmarks.mariadb_load --smoke   # tiny: every check, every type, no verdict

``--smoke`` runs, per driver, the round trip of every Arrow type through the encoder and
the server (``benchmarks/_mariadb_smoke.py``), the strict-mode probe, and each case at 2,000
rows. The server comes from ``--host/--port/--user/--password/--database/--ssl-ca
[--tls-user/--tls-password]`` or ``EOS_MARIADB_HOST``, ``_PORT``, ``_USER``, ``_PASSWORD``,
``_DATABASE``, ``_SSL_CA``, ``_TLS_USER``, ``_TLS_PASSWORD`` (or ``.services.env``); the
password is never printed.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import time
import zlib
from collections.abc import Sequence
from typing import Any

from benchmarks._common import REPO_ROOT, SMOKE_NOTE, format_table, load_service_env

__all__ = ["main"]

_CASES = ("load", "insert", "xa", "connect")  # and "binary": hex against escaped bytes


def _server(args: argparse.Namespace) -> Any:
    from benchmarks._mariadb_drivers import Server

    def env(key: str, given: Any, default: str | None = None) -> str | None:
        value = load_service_env(f"EOS_MARIADB_{key}", str(given) if given else None)
        return value or default

    return Server(host=env("HOST", args.host, "127.0.0.1") or "127.0.0.1",
                  port=int(env("PORT", args.port, "3306") or 3306),
                  user=env("USER", args.user, "eos") or "eos",
                  password=env("PASSWORD", args.password, "") or "",
                  database=env("DATABASE", args.database, "eos") or "eos",
                  ssl_ca=env("SSL_CA", args.ssl_ca), tls_user=env("TLS_USER", args.tls_user),
                  tls_password=env("TLS_PASSWORD", args.tls_password))


def _arrow_rows(n: int) -> Any:
    import pyarrow as pa
    import pyarrow.compute as pc

    ids = pa.array(range(n), pa.int64())
    names = pc.binary_join_element_wise("name-", pc.cast(pc.bit_wise_and(ids, 1023),
                                                           pa.string()), "")
    amounts = pc.multiply(ids.cast(pa.float64()), 0.37)
    start = 1_700_000_000_000_000
    ts = pc.add(ids, start).cast(pa.timestamp("us"))
    return pa.table({"id": ids, "name": names, "amount": amounts, "ts": ts})


def _create(cur: Any, table: str) -> None:
    cur.execute(f"DROP TABLE IF EXISTS {table}")
    cur.execute(f"CREATE TABLE {table} (id BIGINT PRIMARY KEY, name VARCHAR(64) NOT NULL, "
                "amount DOUBLE NOT NULL, ts DATETIME(6) NOT NULL) ENGINE=InnoDB")


def _check(cur: Any, table: str, n: int) -> None:
    cur.execute(f"SELECT COUNT(*), COALESCE(SUM(id), 0) FROM {table}")
    count, total = cur.fetchone()
    if (int(count), int(total)) != (n, n * (n - 1) // 2):
        raise SystemExit(f"{table}: {count} rows (sum {total}), expected {n}")


def _xa(cur: Any, verb: str, xid: str) -> float:
    t0 = time.perf_counter()
    cur.execute(f"XA {verb} '{xid}'")
    return (time.perf_counter() - t0) * 1000


def _binary_case(cur: Any, driver: str, table: str, rows: int) -> dict[str, float]:
    """``rows`` rows of (id, 32 random bytes) loaded with binary as hex + UNHEX, then as
    the escaped bytes: seconds (encode included) and file sizes."""
    import pyarrow as pa

    from benchmarks._mariadb_drivers import in_memory_file
    from connectors.mariadb._encode import LoadPlan

    payload = pa.array([os.urandom(32) for _ in range(rows)], pa.binary())
    data = pa.table({"id": pa.array(range(rows), pa.int64()), "payload": payload})
    crc = sum(zlib.crc32(v) for v in payload.to_pylist())
    out: dict[str, float] = {}
    for mode in ("hex", "bytes"):
        cur.execute(f"DROP TABLE IF EXISTS {table}")
        cur.execute(f"CREATE TABLE {table} (id BIGINT PRIMARY KEY, payload VARBINARY(64) "
                    "NOT NULL) ENGINE=InnoDB")
        t0 = time.perf_counter()
        plan = LoadPlan.for_schema(data.schema, binary=mode)
        encoded = plan.encode(data)
        t1 = time.perf_counter()
        with in_memory_file(encoded, driver) as path:
            cur.execute(plan.statement(table, path))
        t2 = time.perf_counter()
        cur.execute(f"SELECT COUNT(*), SUM(CRC32(payload)) FROM {table}")
        if tuple(int(v) for v in cur.fetchone()) != (rows, crc):
            raise SystemExit(f"binary {mode}: the table differs from the batch")
        out.update({f"{mode}_s": t2 - t0, f"{mode}_encode_s": t1 - t0,
                    f"{mode}_mb": len(encoded) / 1e6})
    cur.execute(f"DROP TABLE {table}")
    return out


def _worker(driver: str, case: str, rows: int, chunk: int, server: Any) -> dict[str, Any]:
    from benchmarks._mariadb_drivers import connect, in_memory_file, version_of
    from benchmarks._mariadb_smoke import STRICT_MODE
    from connectors.mariadb._encode import LoadPlan

    out: dict[str, Any] = {"driver": version_of(driver)}
    table = f"eos_bench_{driver.replace('-', '_')}"
    if case == "connect":
        for tls in (False, True) if server.ssl_ca else (False,):  # no CA: no TLS figure
            times = []
            for _ in range(10):
                t0 = time.perf_counter()
                conn = connect(driver, server, tls=tls)
                cur = conn.cursor()
                cur.execute("SELECT 1")
                cur.fetchall()
                times.append((time.perf_counter() - t0) * 1000)
                if tls:
                    cur.execute("SHOW SESSION STATUS LIKE 'Ssl_version'")
                    out["tls_version"] = str(cur.fetchall()[0][1])
                    if not out["tls_version"]:
                        raise SystemExit(f"{driver}: asked for TLS, connected without it")
                conn.close()
            out["tls_ms" if tls else "plain_ms"] = statistics.median(times)
        return out
    conn = connect(driver, server)
    cur = conn.cursor()
    cur.execute(STRICT_MODE)
    cur.execute("SET time_zone = '+00:00'")
    _create(cur, table)
    data = _arrow_rows(rows if case != "xa" else 100)
    xid = f"eosbench-{driver}-{os.getpid()}"
    mark = "?" if getattr(sys.modules[type(conn).__module__.split(".")[0]], "paramstyle",
                          "format") == "qmark" else "%s"
    insert = f"INSERT INTO {table} (id, name, amount, ts) VALUES ({', '.join([mark] * 4)})"
    if case == "binary":
        return {**out, **_binary_case(cur, driver, table, rows)}
    if case == "xa":
        per: dict[str, list[float]] = {k: [] for k in ("start", "insert", "end", "prepare",
                                                       "commit", "branch")}
        values = list(zip(*(c.to_pylist() for c in data.columns), strict=True))
        for i in range(20):
            t0 = time.perf_counter()
            per["start"].append(_xa(cur, "START", f"{xid}-{i}"))
            t1 = time.perf_counter()
            cur.executemany(insert, [(v[0] + 100 * i, *v[1:]) for v in values])
            per["insert"].append((time.perf_counter() - t1) * 1000)
            for verb in ("END", "PREPARE", "COMMIT"):
                per[verb.lower()].append(_xa(cur, verb, f"{xid}-{i}"))
            per["branch"].append((time.perf_counter() - t0) * 1000)
        _check(cur, table, 2000)
        out.update({f"{k}_ms": statistics.median(v) for k, v in per.items()})
        return out
    t0 = time.perf_counter()
    if case == "load":
        plan = LoadPlan.for_schema(data.schema)
        encoded = plan.encode(data)
        t1 = time.perf_counter()
        _xa(cur, "START", xid)
        with in_memory_file(encoded, driver) as path:
            cur.execute(plan.statement(table, path))
        cur.execute("SELECT @@warning_count")
        if int(cur.fetchone()[0]):
            raise SystemExit(f"{driver}: the load left warnings")
        out["bytes"] = len(encoded)
    else:
        values = list(zip(*(c.to_pylist() for c in data.columns), strict=True))
        t1 = time.perf_counter()
        _xa(cur, "START", xid)
        for i in range(0, len(values), chunk):
            cur.executemany(insert, values[i:i + chunk])
    t2 = time.perf_counter()
    for verb in ("END", "PREPARE", "COMMIT"):
        _xa(cur, verb, xid)
    t3 = time.perf_counter()
    _check(cur, table, rows)
    cur.execute(f"DROP TABLE {table}")
    conn.close()
    out.update({"total_s": t3 - t0, "prep_s": t1 - t0, "write_s": t2 - t1,
                "finish_s": t3 - t2})
    return out


def _run_worker(python: str, driver: str, case: str, args: argparse.Namespace) -> dict[str, Any]:
    cmd = [python, "-m", "benchmarks.mariadb_load", "--worker", driver, "--case", case,
           "--rows", str(args.rows), "--chunk", str(args.chunk)]
    for flag in ("host", "port", "user", "database", "ssl_ca", "tls_user"):
        value = getattr(args, flag)
        if value:
            cmd += [f"--{flag.replace('_', '-')}", str(value)]
    result = subprocess.run(cmd, cwd=REPO_ROOT, capture_output=True, text=True, timeout=1800,
                            env={**os.environ, "PYTHONPATH": str(REPO_ROOT)}, check=False)
    if result.returncode != 0:
        raise SystemExit(f"{driver} {case} failed:\n{result.stderr[-3000:]}")
    return dict(json.loads(result.stdout.strip().splitlines()[-1]))


def _spread(values: Sequence[float], scale: float = 1.0, digits: int = 2) -> str:
    vals = [v * scale for v in values]
    if len(vals) == 1:
        return f"{vals[0]:.{digits}f}"
    return (f"{statistics.median(vals):.{digits}f} [{min(vals):.{digits}f}-"
            f"{max(vals):.{digits}f}]")


def _smoke(drivers: list[tuple[str, str]], server: Any) -> int:
    code = [
        "import json, sys",
        "from benchmarks._mariadb_drivers import connect",
        "from benchmarks._mariadb_smoke import round_trip, strict_probe",
        "from benchmarks.mariadb_load import _server, _parser",
        "args = _parser().parse_args(sys.argv[2:])",
        "conn = connect(sys.argv[1], _server(args))",
        "print(json.dumps({'round_trip': round_trip(conn, sys.argv[1]),"
        " 'strict': strict_probe(conn, sys.argv[1])}))",
    ]
    failed = 0
    for driver, python in drivers:
        argv = [f"--{k}={v}" for k, v in (("host", server.host), ("port", server.port),
                                            ("user", server.user),
                                            ("database", server.database)) if v]
        result = subprocess.run([python, "-c", "\n".join(code), driver, *argv], cwd=REPO_ROOT,
                                capture_output=True, text=True, timeout=600, check=False,
                                env={**os.environ, "PYTHONPATH": str(REPO_ROOT),
                                     "EOS_MARIADB_PASSWORD": server.password})
        if result.returncode != 0:
            print(f"{driver}: FAILED\n{result.stderr[-3000:]}")
            failed += 1
            continue
        found = json.loads(result.stdout.strip().splitlines()[-1])
        print(f"{driver}: round trip of every type: "
              f"{'exact' if not found['round_trip'] else 'DIFFERENT'}")
        for line in found["round_trip"]:
            print("   ", line)
        failed += bool(found["round_trip"])
        print(format_table(["bad value (LOAD DATA LOCAL, strict sql_mode)", "outcome",
                            "refusal (value-free)"], found["strict"]))
        failed += sum("as documented" not in row[1] for row in found["strict"])
    return failed


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--driver", action="append", default=[],
                   help="NAME or NAME=PYTHON (default: every installed driver)")
    p.add_argument("--rows", type=int, default=500_000)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--chunk", type=int, default=5_000, help="rows per executemany call")
    p.add_argument("--cases", default=",".join(_CASES))
    p.add_argument("--smoke", action="store_true")
    p.add_argument("--json", default=None, help="also write every run's figures here")
    for flag in ("host", "port", "user", "password", "database", "ssl-ca", "tls-user",
                 "tls-password"):
        p.add_argument(f"--{flag}", default=None)
    p.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    p.add_argument("--case", default=None, help=argparse.SUPPRESS)
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    server = _server(args)
    if args.worker:
        print(json.dumps(_worker(args.worker, args.case, args.rows, args.chunk, server)))
        return 0
    from benchmarks._mariadb_drivers import DRIVERS

    drivers = [(d.partition("=")[0], d.partition("=")[2] or sys.executable)
               for d in args.driver] or [(d, sys.executable) for d, module in DRIVERS.items()
                                         if importlib.util.find_spec(module.split(".")[0])]
    if not drivers:
        raise SystemExit(f"no MariaDB driver is installed ({', '.join(DRIVERS)}); "
                         "e.g. pip install PyMySQL")
    os.environ["EOS_MARIADB_PASSWORD"] = server.password  # the workers' (never argv)
    if args.smoke:
        print(SMOKE_NOTE)
        failed = _smoke(drivers, server)
        args.rows, args.reps = 2_000, 1
    cases = args.cases.split(",")
    load_before = os.getloadavg()[0]
    runs: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for rep in range(args.reps):
        order = drivers[rep % len(drivers):] + drivers[:rep % len(drivers)]
        for case in cases:
            for driver, python in order:
                figures = _run_worker(python, driver, case, args)
                runs.setdefault((f"{driver}={python}", case), []).append(figures)
                print(f"rep {rep + 1} {case:8s} {figures['driver']:28s} "
                      + " ".join(f"{k}={v:.4g}" for k, v in figures.items()
                                 if isinstance(v, float)), flush=True)
    load_after = os.getloadavg()[0]
    rows = []
    for driver, python in drivers:
        got = {c: runs.get((f"{driver}={python}", c), []) for c in cases}
        name = next((r[0]["driver"] for r in got.values() if r), driver)
        load = [r["total_s"] for r in got.get("load", [])]
        ins = [r["total_s"] for r in got.get("insert", [])]
        xa = got.get("xa", [])
        con = got.get("connect", [])
        rows.append([
            name, _spread(load) if load else "-",
            _spread([r["prep_s"] for r in got.get("load", [])], 1000, 0) if load else "-",
            _spread(ins) if ins else "-",
            _spread([r["prep_s"] for r in got.get("insert", [])], 1000, 0) if ins else "-",
            _spread([sum(r[f"{k}_ms"] for k in ("start", "end", "prepare", "commit"))
                     for r in xa]) if xa else "-",
            _spread([r["branch_ms"] for r in xa]) if xa else "-",
            _spread([r["plain_ms"] for r in con]) if con else "-",
            _spread([r["tls_ms"] for r in con if "tls_ms" in r]) if con and "tls_ms" in con[0]
            else "-"])
    print(f"\n{args.rows:,} rows, {args.reps} repetition(s), median [min-max]; 1-min load "
          f"{load_before:.2f} before, {load_after:.2f} after")
    print(format_table(["driver", "LOAD DATA s", "of it encode ms", "INSERT s",
                        "of it to Python ms", "XA stmts ms (100-row branch)", "branch ms",
                        "connect ms", "connect+TLS ms"], rows))
    binary = [(driver, runs.get((f"{driver}={python}", "binary"), []))
              for driver, python in drivers]
    if any(r for _d, r in binary):
        print(f"\n{args.rows:,} rows of (id, 32 random bytes) into VARBINARY(64), encode "
              "included, median [min-max]")
        print(format_table(
            ["driver", "hex + UNHEX s", "escaped bytes s", "file MB: hex / bytes"],
            [[r[0]["driver"], _spread([x["hex_s"] for x in r]),
              _spread([x["bytes_s"] for x in r]),
              f"{r[0]['hex_mb']:.1f} / {r[0]['bytes_mb']:.1f}"] for _d, r in binary if r]))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({f"{k[0]}|{k[1]}": v for k, v in runs.items()}, f, indent=1)
    return 1 if args.smoke and failed else 0


if __name__ == "__main__":
    raise SystemExit(main())

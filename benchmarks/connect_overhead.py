"""Tiny-batch overhead of Spark Connect against classic PySpark, side by side in one run.

The example file-system sink (``examples.stream_to_files``, the exactly-once template with
its tasks, decision and commit) writes ``--batches`` micro-batches of ``--rows`` rows from
the ``rate-micro-batch`` source, once as a classic driver and once as a Connect client of a
local Connect server, alternating, ``--runs`` times each. Per run the time per batch is
measured from Spark's own commit log (the modification times of ``commits/<b>``), over the
batches after the first ``--warmup`` (JVM start, first imports and the first job's planning
are excluded). Printed: each run's ms per batch, each mode's median and spread, and the
ratio Connect / classic of the medians. Nothing is asserted.

``python -m benchmarks.connect_overhead`` (~5 min on 2 cores; ``--runs 1`` ~2 min).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def one_run(connect: bool, batches: int, rows: int, warmup: int) -> float:
    """ms per batch of one driver run, from the checkpoint's commit log."""
    with tempfile.TemporaryDirectory(prefix="eos-connect-bench-") as tmp:
        root = Path(tmp)
        ckpt = root / "ckpt"
        args = [sys.executable, "-m", "examples.stream_to_files", "--source", "rate",
                "--batches", str(batches), "--rows-per-batch", str(rows),
                "--out", str(root / "out"), "--checkpoint", str(ckpt),
                *(["--connect"] if connect else [])]
        env = dict(os.environ, PYSPARK_PYTHON=sys.executable,
                   PYTHONPATH=os.pathsep.join(filter(None, [str(REPO),
                                                            os.environ.get("PYTHONPATH")])))
        env.pop("CONNECTORS_CRASH_AT", None)
        done = subprocess.run(args, cwd=REPO, env=env, capture_output=True, text=True,
                              timeout=900, check=False)
        if done.returncode != 0:
            raise SystemExit(f"the {'Connect' if connect else 'classic'} run failed:\n"
                             f"{done.stdout[-3000:]}{done.stderr[-3000:]}")
        times = sorted((int(p.name), p.stat().st_mtime) for p in (ckpt / "commits").iterdir()
                       if p.name.isdigit())
        timed = [t for b, t in times if warmup <= b < batches]
        return (timed[-1] - timed[0]) / (len(timed) - 1) * 1000


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, default=40)
    parser.add_argument("--rows", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args(argv)
    results: dict[str, list[float]] = {"classic": [], "connect": []}
    started = time.monotonic()
    for i in range(args.runs):
        for mode in ("classic", "connect") if i % 2 == 0 else ("connect", "classic"):
            ms = one_run(mode == "connect", args.batches, args.rows, args.warmup)
            results[mode].append(ms)
            print(f"run {i + 1} {mode:8s} {ms:7.1f} ms/batch", flush=True)
    med = {m: statistics.median(v) for m, v in results.items()}
    for mode, values in results.items():
        print(f"{mode:8s} median {med[mode]:7.1f} ms/batch  (runs {min(values):.1f}-"
              f"{max(values):.1f})")
    print(f"Connect / classic: {med['connect'] / med['classic']:.2f}x per tiny batch "
          f"({args.rows} rows, file-system sink, {args.batches - args.warmup - 1} batch "
          f"intervals per run, {args.runs} runs each, {time.monotonic() - started:.0f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""The demo: a real streaming job, its driver SIGKILLed mid-run, restarted, output checked.

Runs with no server: the source is a directory of JSON files, the target the example
file-system sink (Parquet files committed by the two-phase protocol). The driver is killed
right after it recorded the decision of batch 3 (the nastiest moment: decided, nothing
committed), restarted from its checkpoint, and the output is compared with the input row
by row::

    python -m examples.demo [--workdir DIR] [--files 8] [--rows-per-file 2000]
"""

from __future__ import annotations

import argparse
import collections
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from examples.fs_sink import read_output
from examples.stream_to_files import make_input_files

REPO = Path(__file__).resolve().parents[1]


def _committed_batches(out: Path) -> int:
    decisions = out / "_ledger" / "demo" / "decisions"
    return len(list(decisions.glob("*.committed"))) if decisions.exists() else 0


def _run(args: list[str], env: dict[str, str], out: Path, label: str) -> tuple[int, float]:
    start = time.monotonic()
    log = out.parent / f"driver-{label}.log"
    with open(log, "w") as sink_log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "examples.stream_to_files", *args],
            cwd=REPO, env=env, stdout=sink_log, stderr=subprocess.STDOUT,
        )
        last = -1
        while proc.poll() is None:
            done = _committed_batches(out)
            if done != last:
                print(f"  [{label}] batches committed: {done}  "
                      f"({time.monotonic() - start:5.1f} s)", flush=True)
                last = done
            time.sleep(0.2)
    return proc.returncode, time.monotonic() - start


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", help="where input, output and checkpoint go")
    parser.add_argument("--files", type=int, default=8, help="input files = micro-batches")
    parser.add_argument("--rows-per-file", type=int, default=2000)
    parser.add_argument("--crash-batch", type=int, default=3)
    args = parser.parse_args(argv)

    root = Path(args.workdir or tempfile.mkdtemp(prefix="connectors-demo-"))
    inp, out, ckpt = root / "in", root / "out", root / "ckpt"
    rows_in = make_input_files(inp, args.files, args.rows_per_file)
    print(f"connectors demo in {root}: {rows_in} rows in {args.files} files "
          f"(one micro-batch each), sink: example file-system sink")
    job = ["--source", "files", "--input", str(inp), "--out", str(out),
           "--checkpoint", str(ckpt), "--sink-id", "demo"]
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    env.setdefault("PYSPARK_PYTHON", sys.executable)

    started = time.monotonic()
    print(f"run 1: the driver will be SIGKILLed after deciding batch {args.crash_batch}")
    crash_env = dict(env, CONNECTORS_CRASH_AT=f"after_decision:batch={args.crash_batch}")
    code1, t1 = _run(job, crash_env, out, "run 1")
    killed = code1 == -signal.SIGKILL
    print(f"  run 1 ended: {'SIGKILLed' if killed else f'exit code {code1}'} after {t1:.1f} s")
    print("run 2: restart from the checkpoint (reconciles, replays the killed batch)")
    code2, t2 = _run(job, env, out, "run 2")
    print(f"  run 2 ended: exit code {code2} after {t2:.1f} s")

    table = read_output(out)
    ids = table["id"].to_pylist() if table is not None else []
    counts = collections.Counter(ids)
    duplicates = sum(c - 1 for c in counts.values() if c > 1)
    missing = sum(1 for i in range(rows_in) if counts[i] == 0)
    prepared = list((out / "_staging").glob("*.prepared")) if (out / "_staging").exists() else []
    ok = killed and code2 == 0 and not duplicates and not missing and not prepared
    rows = [
        ("rows in", rows_in), ("rows out", len(ids)), ("duplicates", duplicates),
        ("missing", missing), ("batches", _committed_batches(out)),
        ("restarts", 1), ("driver killed", "yes (SIGKILL)" if killed else "NO"),
        ("left prepared", len(prepared)), ("time", f"{time.monotonic() - started:.1f} s"),
        ("verdict", "EXACTLY ONCE" if ok else "FAILED"),
    ]
    width = max(len(k) for k, _ in rows)
    print("\n" + "\n".join(f"  {k:<{width}}  {v}" for k, v in rows))
    if not ok:
        print(f"driver logs: {root}/driver-run *.log", file=sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())

"""Helpers shared by the benchmarks: service addresses, extra jars, statistics, tables."""

from __future__ import annotations

import fcntl
import math
import os
import shutil
import statistics
import subprocess
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

__all__ = [
    "REPO_ROOT",
    "SMOKE_NOTE",
    "fetch_maven_jar",
    "format_table",
    "judged",
    "load_service_env",
    "machine_cpu_seconds",
    "make_batches",
    "median",
    "ratio_interval",
    "ratio_verdict",
    "stopwatch",
]

#: The repository root: holds ``.services.env`` and the ``connectors`` package.
REPO_ROOT = Path(__file__).resolve().parent.parent

#: What a ``--smoke`` run prints: it runs every contender and check at the smallest size.
SMOKE_NOTE = ("--smoke: every contender and every result check at the smallest size, for "
              "correctness only; this run judges nothing (too few rows and batches to "
              "measure a speed)")

_DEPENDENCY_PLUGIN = "org.apache.maven.plugins:maven-dependency-plugin:3.6.1"


def load_service_env(key: str, override: str | None = None) -> str | None:
    """``override``, else ``$key``, else ``key`` from ``.services.env`` (``scripts/services``)."""
    if override:
        return override
    value = os.environ.get(key)
    if value:
        return value
    env_file = REPO_ROOT / ".services.env"
    try:
        lines = env_file.read_text(encoding="utf-8").splitlines()
    except OSError:
        return None
    for line in lines:
        name, sep, raw = line.strip().partition("=")
        if sep and name == key:
            return raw.strip().strip("'\"")
    return None


def _cache_root() -> Path:
    return Path(os.environ.get("EOS_CACHE_DIR") or "~/.cache/connectors").expanduser()


def fetch_maven_jar(group: str, artifact: str, version: str, *, dirname: str) -> Path:
    """One jar (no dependencies) from Maven Central, cached like ``connectors.spark`` does.

    The jar lands in ``<cache>/jars/<dirname>/<artifact>-<version>.jar``; Maven runs only
    when it is not there yet, under the same lock file as :mod:`connectors.spark`.
    """
    jars_root = _cache_root() / "jars"
    target_dir = jars_root / dirname
    jar = target_dir / f"{artifact}-{version}.jar"
    if jar.is_file():
        return jar
    mvn = os.environ.get("EOS_MVN") or shutil.which("mvn")
    if not mvn:
        raise RuntimeError(
            f"{jar} is missing and Maven ('mvn') is not on PATH to fetch "
            f"{group}:{artifact}:{version}; install Maven or put the jar there yourself"
        )
    jars_root.mkdir(parents=True, exist_ok=True)
    with open(jars_root / ".resolve.lock", "a+b") as lock:
        fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
        if jar.is_file():  # fetched by another process meanwhile
            return jar
        work = Path(tempfile.mkdtemp(prefix=f".{dirname}.", dir=jars_root))
        try:
            out = work / dirname
            cmd = [
                mvn,
                "-B",
                "-q",
                f"{_DEPENDENCY_PLUGIN}:copy",
                f"-Dartifact={group}:{artifact}:{version}:jar",
                f"-DoutputDirectory={out}",
                f"-Dmaven.repo.local={jars_root / '.maven-repo'}",
            ]
            proc = subprocess.run(
                cmd, cwd=work, capture_output=True, text=True, timeout=600, check=False
            )
            if proc.returncode != 0 or not (out / jar.name).is_file():
                raise RuntimeError(
                    f"Maven could not fetch {group}:{artifact}:{version}:\n"
                    f"{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}"
                )
            if target_dir.exists():
                shutil.rmtree(target_dir)
            os.rename(out, target_dir)
        finally:
            shutil.rmtree(work, ignore_errors=True)
    return jar


def judged(verdict: str, smoke: bool) -> str:
    """``verdict`` (met, NOT met, ...), or ``not judged (--smoke)`` in a smoke run."""
    return "not judged (--smoke)" if smoke else verdict


def median(values: Sequence[float]) -> float:
    """The median, or NaN for no values."""
    return float(statistics.median(values)) if values else float("nan")


def ratio_interval(
    numerators: Sequence[float], denominators: Sequence[float], *, level: float = 0.95,
    resamples: int = 4000, seed: int = 1,
) -> tuple[float, float]:
    """A bootstrap interval for ``sum(numerators) / sum(denominators)`` over paired samples
    (e.g. batch ``i`` of two contenders): how far the noise of the machine moves the ratio."""
    import random

    n = len(numerators)
    if n == 0 or n != len(denominators):
        return float("nan"), float("nan")
    rng = random.Random(seed)
    ratios = []
    for _ in range(resamples):
        picks = [rng.randrange(n) for _ in range(n)]
        ratios.append(sum(numerators[i] for i in picks) / sum(denominators[i] for i in picks))
    ratios.sort()
    tail = (1 - level) / 2
    return ratios[int(tail * resamples)], ratios[min(resamples - 1, int((1 - tail) * resamples))]


def ratio_verdict(ratio: float, low: float, high: float, rounds: int, target: float) -> str:
    """A sink's ratio to its baseline against ``target``, by its interval ``[low, high]``
    (:func:`ratio_interval`): met, NOT met, or undecided with the rounds that would decide."""
    if high <= target:
        return "met"
    if low > target:
        return "NOT met"
    margin = abs(target - ratio)
    half = (high - low) / 2
    # The interval narrows with the square root of the batch pairs: the rounds whose
    # half-width would fit between the ratio and the target.
    need = max(rounds + 1, math.ceil(rounds * (half / margin) ** 2)) if margin > 0 else None
    return (f"{'met' if ratio <= target else 'NOT met'} by the ratio, undecided by the "
            "interval (it holds the target)"
            + (f": about {need} rounds would decide it" if need and need <= 10 * rounds
               else f": more than {10 * rounds} rounds would be needed"))


def make_batches(spark: SparkSession, batches: int, rows: int, partitions: int) -> list[DataFrame]:
    """``batches`` micro-batches of ``rows`` rows each (``id bigint, name string, amount
    double, ts timestamp``; batch ``b`` holds ids ``b * rows`` to ``(b + 1) * rows - 1``) in
    ``partitions`` partitions, cached in memory and materialised before any timing."""
    from pyspark import StorageLevel
    from pyspark.sql import functions as F  # noqa: N812

    out = []
    for b in range(batches):
        idc = F.col("id")
        df = spark.range(b * rows, (b + 1) * rows, 1, partitions).select(
            idc.alias("id"),
            F.concat(F.lit("customer-"), F.lpad((idc % 1_000_003).cast("string"), 7, "0"))
            .alias("name"),
            ((idc % 100_000) / F.lit(100.0)).alias("amount"),
            F.timestamp_micros(F.lit(1_700_000_000_000_000) + idc * 1001).alias("ts"),
        ).persist(StorageLevel.MEMORY_ONLY)
        df.count()
        out.append(df)
    return out


def machine_cpu_seconds() -> float | None:
    """CPU-seconds the whole machine has spent busy so far (every process: Spark's JVM, its
    Python workers, a local broker), from ``/proc/stat`` (user, nice, system, irq, softirq,
    steal); ``None`` where there is no ``/proc/stat``. The difference around a run is the
    CPU the run cost, which moves less than its wall time on a noisy machine."""
    try:
        with open("/proc/stat", encoding="ascii") as fh:
            fields = fh.readline().split()
    except OSError:
        return None
    if not fields or fields[0] != "cpu":
        return None
    busy = [int(v) for v in fields[1:4]] + [int(v) for v in fields[6:9]]
    return sum(busy) / os.sysconf("SC_CLK_TCK")


@contextmanager
def stopwatch() -> Iterator[list[float]]:
    """``with stopwatch() as t: ...`` then ``t[0]`` is the block's wall time in seconds."""
    box: list[float] = []
    started = time.perf_counter()
    try:
        yield box
    finally:
        box.append(time.perf_counter() - started)


def format_table(headers: Sequence[str], rows: Sequence[Sequence[str]], align: str = "") -> str:
    """A Markdown table (also readable as plain text), columns padded to align.

    ``align`` has one letter per column, ``l`` or ``r``; missing letters: the first column
    left, the others right.
    """
    widths = [len(h) for h in headers]
    for row in rows:
        for i, cell in enumerate(row):
            widths[i] = max(widths[i], len(cell))
    sides = [align[i] if i < len(align) else ("l" if i == 0 else "r") for i in range(len(widths))]

    def line(cells: Sequence[str]) -> str:
        padded = (
            c.ljust(widths[i]) if sides[i] == "l" else c.rjust(widths[i])
            for i, c in enumerate(cells)
        )
        return "| " + " | ".join(padded) + " |"

    rule = (
        "|"
        + "|".join(
            ":" + "-" * (w + 1) if side == "l" else "-" * (w + 1) + ":"
            for w, side in zip(widths, sides, strict=True)
        )
        + "|"
    )
    return "\n".join([line(headers), rule, *(line(r) for r in rows)])

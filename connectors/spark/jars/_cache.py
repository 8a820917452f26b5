"""The jar cache: completion stamps, the resolve lock, and publishing a resolved directory.

Layout under ``$EOS_CACHE_DIR`` (default ``~/.cache/connectors``): ``jars/.resolve.lock``,
``jars/.maven-repo/`` and one directory per component and version holding the jars and
``.complete.json``. :func:`resolve_plan` answers from a complete directory without
starting Maven; otherwise it takes the lock, checks again, and :func:`_fetch` runs Maven
in a temporary directory that is renamed into place with its stamp already inside.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from connectors.core.errors import ConfigurationError
from connectors.spark.jars._components import Plan, artifact_id_of, provided_artifact_ids
from connectors.spark.jars._maven import mvn_executable, run_maven
from connectors.spark.jars._releases import refuse_cross_minor

logger = logging.getLogger(__name__)

_DEFAULT_CACHE = "~/.cache/connectors"
_STAMP = ".complete.json"
_LOCK = ".resolve.lock"

_Stamped = tuple[list[str], dict[str, object]]


def cache_root(cache_dir: str | None) -> Path:
    raw = cache_dir or os.environ.get("EOS_CACHE_DIR") or _DEFAULT_CACHE
    return Path(raw).expanduser()


def read_stamp(target: Path) -> _Stamped | None:
    """The jars and stamp of a completed cache directory, ``None`` when it is not complete."""
    try:
        data = json.loads((target / _STAMP).read_text(encoding="utf-8"))
        names = [str(n) for n in data["jars"]]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    paths = [str(target / n) for n in names]
    if not all(os.path.isfile(p) for p in paths):
        logger.warning("Jar cache %s is incomplete; resolving again", target)
        return None
    return paths, data


@contextlib.contextmanager
def _file_lock(path: Path) -> Iterator[None]:
    """Hold an exclusive ``flock`` on ``path`` (created if needed) for the block."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        handle = open(path, "a+b")  # noqa: SIM115 (closed in the finally below)
    except OSError as exc:
        raise ConfigurationError(
            f"Cannot use the jar cache {path.parent}: {exc}. Point EOS_CACHE_DIR (or "
            "cache_dir=) at a writable directory."
        ) from exc
    try:
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            logger.info("Waiting for another process resolving jars (lock %s)", path)
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        yield
    finally:
        handle.close()  # closing releases the lock


def resolve_plan(plan: Plan, jars_root: Path, spark_home: Path) -> _Stamped:
    target = jars_root / plan.dirname
    cached = read_stamp(target)
    if cached is None:
        with _file_lock(jars_root / _LOCK):
            cached = read_stamp(target)  # another process may have finished meanwhile
            if cached is None:
                return _fetch(plan, target, spark_home)
    refuse_cross_minor(plan, target, cached[1])
    return cached


def _fetch(plan: Plan, target: Path, spark_home: Path) -> _Stamped:
    mvn = mvn_executable(plan)
    jars_root = target.parent
    jars_root.mkdir(parents=True, exist_ok=True)
    provided = provided_artifact_ids(spark_home / "jars")
    started = time.monotonic()
    work = Path(tempfile.mkdtemp(prefix=f".{plan.dirname}.", dir=jars_root))
    try:
        out_dir = work / plan.dirname
        substitutions, originals = run_maven(mvn, plan, work, out_dir, provided)
        jars = sorted(
            n
            for n in os.listdir(out_dir)
            if n.endswith(".jar") and artifact_id_of(n) not in provided
        )
        for name in os.listdir(out_dir):
            if name not in jars:
                (out_dir / name).unlink()
        stamp: dict[str, object] = {
            "component": plan.component,
            "requested": [str(a) for a in plan.roots],
            "substituted": {f"{g}:{a}": v for (g, a), v in substitutions.items()},
            "substituted_from": {f"{g}:{a}": v for (g, a), v in originals.items()},
            "jars": jars,
            "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }
        (out_dir / _STAMP).write_text(json.dumps(stamp, indent=2) + "\n", encoding="utf-8")
        if target.exists():  # a directory without a valid stamp: a crashed earlier run
            shutil.rmtree(target)
        os.rename(out_dir, target)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    logger.info(
        "Resolved %s jars (%d files) into %s in %.1f s",
        plan.component,
        len(jars),
        target,
        time.monotonic() - started,
    )
    return [str(target / n) for n in jars], stamp

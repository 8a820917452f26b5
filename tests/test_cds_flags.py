"""integration/support/_cds.py without a JVM: the test drivers' flags name the AppCDS archive
only when it exists (a JVM would start without a missing one, but with a warning)."""

from __future__ import annotations

from pathlib import Path

import pytest

from integration.support import _cds


def test_flags_name_the_archive_only_when_it_exists(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(_cds.ENV_ARCHIVE, raising=False)
    assert _cds.driver_flags() == _cds.BASE_FLAGS
    archive = tmp_path / "spark.jsa"
    monkeypatch.setenv(_cds.ENV_ARCHIVE, str(archive))
    assert _cds.driver_flags() == _cds.BASE_FLAGS  # not built (yet)
    archive.write_bytes(b"\0")
    flags = _cds.driver_flags()
    assert flags.startswith(_cds.BASE_FLAGS)
    assert f"-XX:SharedArchiveFile={archive}" in flags.split()
    assert "-XX:ArchiveClassesAtExit" not in flags  # only the build writes one


def test_the_archive_is_named_for_this_pyspark(tmp_path: Path) -> None:
    import pyspark

    path = _cds.archive_in(tmp_path)
    assert path.parent == tmp_path and path.name.startswith(f"spark-{pyspark.__version__}-")
    assert _cds.archive_in(tmp_path) == path  # stable: one archive per pyspark, JDK, Python

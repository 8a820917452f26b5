"""integration.support._driver.file_batches: each file's micro-batch, also when a restart
read two of the file source's batches in one micro-batch."""

from __future__ import annotations

from pathlib import Path

from integration.support._driver import file_batches
from tests.testing.test_kill_harness import merged_checkpoint


def test_two_source_batches_in_one_micro_batch(tmp_path: Path) -> None:
    ckpt = merged_checkpoint(tmp_path)
    assert file_batches(ckpt) == {"part-00000.json": 0, "part-00001.json": 1,
                                  "part-00002.json": 2, "part-00003.json": 2}


def test_a_file_past_the_offset_log_keeps_its_source_batch(tmp_path: Path) -> None:
    ckpt = merged_checkpoint(tmp_path)
    entry = '{"path":"file:///in/part-00004.json","timestamp":1,"batchId":4}'
    (ckpt / "sources" / "0" / "4").write_text(f"v1\n{entry}")
    assert file_batches(ckpt)["part-00004.json"] == 4

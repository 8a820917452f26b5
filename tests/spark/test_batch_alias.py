"""``connectors.spark.batch``: a deprecated alias for one release."""

from __future__ import annotations

import importlib
import sys

import pytest


def test_the_old_module_warns_and_hands_out_each_name_from_its_home() -> None:
    sys.modules.pop("connectors.spark.batch", None)
    with pytest.warns(DeprecationWarning, match="connectors.spark.frames"):
        old = importlib.import_module("connectors.spark.batch")
    from connectors.spark._handover import Handover
    from connectors.spark.frames import SparkBatch, front_end

    assert (old.SparkBatch, old.front_end, old.Handover) == (SparkBatch, front_end, Handover)
    assert len(old.MOVED) == 29  # its old __all__: SparkBatch and 28 more
    for name in old.MOVED:
        assert getattr(old, name) is not None
    with pytest.raises(AttributeError):
        old.nothing_here  # noqa: B018

"""The hooks are declared once, on the templates authors subclass
(:class:`~connectors.core.templates.template.TwoPhaseCommitSink` and the three families of
:mod:`connectors.core.templates.families`), and the driver and executor sides call nothing else.

The executor and its performers (``core/driver/executor.py``, ``performers.py``), the
sink driver (``core/driver/sink_driver.py``) and the tasks (``core/templates/tasks.py``)
refer to the templates for type checking only (the template imports the driver to run a
batch): this test reads what they call on a sink, and every such name must be a documented
hook or attribute of a template; every abstract hook must be one they call.
"""

from __future__ import annotations

import ast
import inspect
import re
from pathlib import Path

from connectors.core.templates import families
from connectors.core.templates.template import TwoPhaseCommitSink

CORE = Path(families.__file__).resolve().parents[1]
TEMPLATES = (TwoPhaseCommitSink, families.PreparedTransactionSink, families.TaskCommitSink,
             families.DriverCommitSink)
#: The names the executor, its performers, the driver and the tasks hold a sink under.
SINK_NAMES = {"sink", "sink_p", "sink_s", "sink_d", "sink_i"}
#: ... and the attributes (of ``self``, ``run`` or ``self.run``).
SINK_ATTRIBUTES = {"sink", "_prepared", "_slots", "_driver_commit", "_one"}


def _is_sink(node: ast.expr) -> bool:
    """``sink`` (or ``sink_p``, ...), ``self.sink``, ``run.sink``, ``self.run.sink``,
    ``self._prepared`` (a performer's typed view)."""
    if isinstance(node, ast.Name):
        return node.id in SINK_NAMES
    if not isinstance(node, ast.Attribute) or node.attr not in SINK_ATTRIBUTES:
        return False
    holder = node.value
    return ((isinstance(holder, ast.Name) and holder.id in {"self", "run"})
            or (isinstance(holder, ast.Attribute) and holder.attr == "run"
                and isinstance(holder.value, ast.Name) and holder.value.id == "self"))


def called_on_sinks(source: str) -> set[str]:
    """Attribute names read from a sink (``sink.x``, ``sink_p.x``, ``self.sink.x``)."""
    found = set()
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Attribute):
            continue
        holder = node.value
        if _is_sink(holder) or (isinstance(holder, ast.Call) and isinstance(holder.func, ast.Name)
                                and holder.func.id == "cast" and _is_sink(holder.args[1])):
            found.add(node.attr)  # sink.x, self.sink.x, cast("TaskCommitSink[Any]", self.sink).x
    return found


CALLED = set().union(*(called_on_sinks((CORE / name).read_text()) for name in (
    "driver/executor.py", "driver/execution.py", "driver/performers.py",
    "driver/sink_driver.py", "templates/tasks.py")))


def declared(name: str) -> object | None:
    for template in TEMPLATES:
        member = inspect.getattr_static(template, name, None)
        if member is not None:
            return member
    return None


def test_the_reader_sees_the_calls() -> None:
    assert {"begin_run", "begin_transaction", "pre_commit", "commit", "list_prepared",
            "open_slot", "commit_slot", "fence_all", "plan_slots", "record_slots",
            "is_committed", "commit_batch", "record_intent", "plan_input",
            "fingerprint_input", "sink_id", "retry"} <= CALLED
    assert called_on_sinks("def f(sink):\n    sink.hook(1)\n") == {"hook"}


def test_everything_the_executor_calls_is_a_documented_template_hook() -> None:
    for name in sorted(CALLED):
        member = declared(name)
        if member is None:  # an instance attribute set in a template's __init__
            init = "".join(inspect.getsource(t.__init__) for t in TEMPLATES
                           if "__init__" in vars(t))
            assert re.search(rf"self\.{name}\b(: [^=]+)? =", init), \
                f"the executor calls {name}, no template has it"
            continue
        if callable(member) or isinstance(member, property):
            assert (getattr(member, "__doc__", None) or "").strip(), f"{name} is undocumented"


def test_every_abstract_hook_is_one_the_executor_calls() -> None:
    for template in TEMPLATES:
        missing = sorted(set(template.__abstractmethods__) - CALLED - {"create_ledger"})
        assert not missing, f"{template.__name__}: abstract hooks nobody calls: {missing}"


def test_no_typing_protocol_of_the_core_declares_a_hook_again() -> None:
    hooks = CALLED | {name for t in TEMPLATES for name in t.__abstractmethods__}
    again = []
    for path in sorted(CORE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef) and any(
                    isinstance(b, ast.Name) and b.id == "Protocol" for b in node.bases):
                names = {f.name for f in node.body if isinstance(f, ast.FunctionDef)}
                again += [f"{path.name}:{node.name}.{n}" for n in sorted(names & hooks)]
    assert not again, f"hooks declared a second time: {again}"


def test_no_sink_overrides_the_entry_points() -> None:
    # The hooks get what they need (a driver hook's ctx.batch, begin_run's ctx): no sink
    # of connectors/ takes over the template's entry points to keep the batch for them.
    entry = {"write_batch", "run_batch"}
    overriding = []
    for path in sorted(CORE.parent.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            # FanOut is no sink: it has entry points of its own over its targets'; nor is
            # the conformance kit's _SplitSink (a sink's DataSource form, step by step).
            if isinstance(node, ast.ClassDef) and node.name not in (
                    "TwoPhaseCommitSink", "FanOut", "_SplitSink"):
                names = {f.name for f in node.body if isinstance(f, ast.FunctionDef)}
                overriding += [f"{path.name}:{node.name}.{n}" for n in sorted(names & entry)]
    assert not overriding, overriding
    import connectors.testing
    from connectors.delta import DeltaSink
    from connectors.kafka import KafkaSink
    from connectors.postgres import PostgresSink

    sinks = [DeltaSink, KafkaSink, PostgresSink, *(
        c for c in vars(connectors.testing).values()
        if isinstance(c, type) and issubclass(c, TwoPhaseCommitSink))]
    assert len(sinks) > 5
    for sink in sinks:
        for klass in sink.__mro__[:sink.__mro__.index(TwoPhaseCommitSink)]:
            assert not {"__call__", "_call", "_write"} & set(vars(klass)), klass

"""The engine's parts talk through methods: no module of ``flowscope.engine`` reads or
writes another object's private attributes (``x._name`` for any ``x`` but ``self`` and
``cls``). The invocation is composed of parts, each with its own state, and the runner
calls the invocation's public API; a context's attempt counters are reset by
``NodeContext.next_attempt``, not from outside.
"""

from __future__ import annotations

import ast
from pathlib import Path

ENGINE = Path(__file__).resolve().parents[2] / "src" / "flowscope" / "engine"


def private_reaches(source: str) -> list[str]:
    """``x._name`` accesses in ``source`` where ``x`` is not ``self`` or ``cls`` (dunders aside)."""
    found = []
    for n in ast.walk(ast.parse(source)):
        if not isinstance(n, ast.Attribute):
            continue
        name = n.attr
        if not name.startswith("_") or (name.startswith("__") and name.endswith("__")):
            continue
        owner = n.value
        if isinstance(owner, ast.Name) and owner.id in ("self", "cls"):
            continue
        found.append(f"{ast.unparse(n)} (line {n.lineno})")
    return found


def test_no_engine_module_reaches_into_another_objects_private_state():
    reaches = {
        p.name: r
        for p in sorted(ENGINE.glob("*.py"))
        if (r := private_reaches(p.read_text(encoding="utf-8")))
    }
    assert reaches == {}


def test_the_check_sees_reads_writes_and_calls():
    src = "ctx._children.clear()\nctx._requests = 0\nx = inv._rec\nself._ok = 1\ncls._ok2\nobj.__class__\n"
    assert sorted(private_reaches(src)) == [
        "ctx._children (line 1)",
        "ctx._requests (line 2)",
        "inv._rec (line 3)",
    ]

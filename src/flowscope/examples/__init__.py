"""The workflows bundled with flowscope, which ``flowscope demo`` runs.

``order_fulfilment`` (:mod:`.demo`) is a realistic pipeline with a flaky node, a nested
workflow, parallel branches and a join, a long-running external job, a human approval,
dynamic children and a completion marker. ``nightly_export`` (:mod:`.worker`) is the job
whose worker ``flowscope demo`` kills mid-run so that ``flowscope stuck`` has something to
find.

``flowscope resume`` finds a session's workflow here by name unless ``--workflow
module:attr`` says otherwise.
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

__all__ = ["BUNDLED", "bundled_workflow", "load_workflow"]

#: workflow name -> "module:attribute" of the bundled Workflow object
BUNDLED = {
    "order_fulfilment": "flowscope.examples.demo:order_fulfilment",
    "nightly_export": "flowscope.examples.worker:nightly_export",
}


def load_workflow(spec: str) -> Any:
    """Import ``module:attr`` (a ``Workflow``, or a function of no arguments returning one)."""
    from ..engine import Workflow

    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"{spec!r} is not of the form module:attribute (e.g. myapp.flows:orders)")
    try:
        module = import_module(module_name)
    except ImportError as exc:
        raise ValueError(f"cannot import module {module_name!r}: {exc}") from None
    obj: Any = module
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise ValueError(f"module {module_name!r} has no attribute {attr!r}") from None
    if not isinstance(obj, Workflow) and callable(obj):
        obj = obj()
    if not isinstance(obj, Workflow):
        raise ValueError(f"{spec} is a {type(obj).__name__}, not a flowscope Workflow")
    return obj


def bundled_workflow(name: str) -> Any | None:
    """The bundled workflow called ``name``, or None."""
    spec = BUNDLED.get(name)
    return load_workflow(spec) if spec is not None else None

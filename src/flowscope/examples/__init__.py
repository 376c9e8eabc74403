"""The workflows bundled with flowscope, which ``flowscope demo`` runs.

``order_fulfilment`` (:mod:`.demo`) is a realistic pipeline with a flaky node, a nested
workflow, parallel branches and a join, a long-running external job, a human approval,
dynamic children and a completion marker. ``nightly_export`` (:mod:`.worker`) is the job
whose worker ``flowscope demo`` kills mid-run so that ``flowscope stuck`` has something to
find.

``flowscope resume`` finds the code of a session ``flowscope demo`` made (its id starts
with ``demo-``) here by name, unless ``--workflow module:attr`` says otherwise. A session
of a workflow of yours that shares a bundled name is yours: the bundled code never runs
it, and no hint names it (:func:`bundled_for`).
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

__all__ = [
    "BUNDLED",
    "DEMO_PREFIX",
    "bundled_for",
    "bundled_workflow",
    "load_workflow",
    "load_target",
    "as_workflow",
]

#: workflow name -> "module:attribute" of the bundled Workflow object
BUNDLED = {
    "order_fulfilment": "flowscope.examples.demo:order_fulfilment",
    "nightly_export": "flowscope.examples.worker:nightly_export",
}


#: The start of every session id ``flowscope demo`` gives.
DEMO_PREFIX = "demo-"


def bundled_for(workflow: str, session_id: str) -> str | None:
    """The ``module:attr`` of the bundled workflow that runs session ``session_id`` when no
    ``--workflow`` names its code: ``workflow`` is bundled and ``flowscope demo`` made the
    session. None for any other session, whatever its workflow's name: running the demo's
    code on a workflow of yours named ``order_fulfilment`` would fail it, or worse."""
    return BUNDLED.get(workflow) if session_id.startswith(DEMO_PREFIX) else None


def load_target(spec: str) -> Any:
    """The object ``module:attr`` names, importing the module; a ``ValueError`` with one
    line to print when it cannot: a malformed spec, a module that is not there or that
    raises while it is imported (its message redacted, as every message flowscope
    prints), an attribute it does not have."""
    from ..errors import redact_message

    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"{spec!r} is not of the form module:attribute (e.g. myapp.flows:orders)")
    try:
        module = import_module(module_name)
    except ImportError as exc:
        raise ValueError(f"cannot import module {module_name!r}: {redact_message(str(exc))}") from None
    except KeyboardInterrupt:
        raise
    except (
        BaseException
    ) as exc:  # the module's own code failed (sys.exit from argparse too): the user's to fix
        message = redact_message(" ".join(str(exc).split()))[:300]
        raise ValueError(f"importing module {module_name!r} raised {type(exc).__name__}: {message}") from None
    obj: Any = module
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise ValueError(f"module {module_name!r} has no attribute {attr!r}") from None
    return obj


def as_workflow(obj: Any, spec: str) -> Any:
    """``obj`` as a Workflow: a Workflow, or a function of no arguments returning one. A
    node, or anything else, is a ``ValueError`` saying what it is instead."""
    from ..engine import Node, Workflow

    if isinstance(obj, Node) and not isinstance(obj, Workflow):
        raise ValueError(
            f"{spec} is a node ({obj.name!r}), not a workflow: name the Workflow whose edges use it"
        )
    if not isinstance(obj, Workflow) and callable(obj) and not isinstance(obj, type):
        try:
            obj = obj()
        except KeyboardInterrupt:
            raise
        except BaseException as exc:
            raise ValueError(
                f"{spec} is a function that raised {type(exc).__name__} when called with no arguments, not a Workflow factory"
            ) from None
    if not isinstance(obj, Workflow):
        raise ValueError(f"{spec} is a {type(obj).__name__}, not a flowscope Workflow")
    return obj


def load_workflow(spec: str) -> Any:
    """Import ``module:attr`` (a ``Workflow``, or a function of no arguments returning one)."""
    return as_workflow(load_target(spec), spec)


def bundled_workflow(name: str) -> Any | None:
    """The bundled workflow called ``name``, or None."""
    spec = BUNDLED.get(name)
    return load_workflow(spec) if spec is not None else None

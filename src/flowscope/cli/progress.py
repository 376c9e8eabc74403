"""Progress lines while a workflow runs (``flowscope demo``, ``flowscope resume``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..plugins import Plugin
from .app import silence_stdout
from .history import redacted
from .render import invocation_label, one_line_text

__all__ = ["ProgressPlugin"]


def _short(path: str) -> str:
    """``order_fulfilment@1/reserve_stock@1/check_stock@1`` -> indented ``check_stock@1``."""
    parts = path.split("/")
    return "  " * (len(parts) - 1) + parts[-1]


class ProgressPlugin(Plugin):
    """Prints one line per notable event, as it is appended."""

    name = "progress"

    def __init__(self, echo: Callable[[str], None], *, show_payloads: bool = False) -> None:
        self.echo = echo
        self.enabled = True
        #: Whether an answer's value is printed as it is (else ``<redacted: N bytes>``).
        self.show_payloads = show_payloads

    def on_event(self, e: Any) -> None:
        if not self.enabled:
            return
        line = self.line(e)
        if line:
            try:
                self.echo(line)
            except BrokenPipeError:  # `flowscope demo | head`: stop printing, let the run finish
                self.enabled = False
                silence_stdout()

    def line(self, e: Any) -> str | None:
        t = e.type
        where = f"{_short(e.path):<28}" if e.path else ""

        def say(marker: str, text: str) -> str:
            return f"  {marker:<9} {one_line_text(text)}"  # a message's breaks and escapes, shown

        if t == "run_started":
            if e.resumed:
                extra = f", {e.recovered} crashed run(s) to re-execute" if e.recovered else ""
                return say(
                    "resume",
                    f"invocation {invocation_label(e.invocation_id)}: {e.replayed} finished run(s) kept from the log{extra}",
                )
            return say("run", f"invocation {invocation_label(e.invocation_id)} of {e.workflow}")
        if t == "node_completed":
            note = "   returned nothing: completion marker" if not e.has_output else ""
            return say("ok", f"{where} attempt {e.attempt_count}{note}")
        if t == "node_retrying":
            return say(
                "retry",
                f"{where} attempt {e.attempt} failed: {e.error_type} [{e.error_code}] "
                f"{e.error_message}; next attempt in {e.delay_s:.2f}s",
            )
        if t == "node_error":
            return say("FAILED", f"{where} {e.error_type} [{e.error_code}] {e.error_message}")
        if t == "node_cancelled":
            return say("cancelled", f"{where} ({e.reason})")
        if t == "job_dispatched":
            return say("job", f"{where} dispatched {e.job_id} (dispatch attempt {e.dispatch_attempt})")
        if t == "job_result":
            return say("job", f"{where} {e.job_id} reported success={e.success} count={e.count}: {e.result}")
        if t == "input_requested":
            payload = e.payload if isinstance(e.payload, dict) else {}
            if payload.get("kind") == "job_failed":
                return say(
                    "pause", f"{where} {payload.get('problem')}; asks {e.interrupt_id!r}: retry or abort"
                )
            return say("pause", f"{where} asks {e.interrupt_id!r}: {e.prompt}")
        if t == "input_received":
            value = repr(e.value) if self.show_payloads else redacted(e.value)
            return say("answer", f"{where} {e.interrupt_id!r} = {value}")
        if t == "run_finished":
            return say(e.status, f"invocation {invocation_label(e.invocation_id)}")
        return None

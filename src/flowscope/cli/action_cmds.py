"""``flowscope retry`` and ``flowscope cancel``: act on sessions without their code.

Each is a message through the session's inbox (:mod:`flowscope.actions`), carried out
by the live owner or the next one, so no action appends under a running worker's feet.
Given no SESSION, both act on every session the filters select (``--workflow``,
``--state``, ``--older-than``): ``--dry-run`` lists them, ``--yes`` acts on them. A dry
run (of SESSION too) runs the action on a :class:`~.session_ops.DryRunStore`: it says
which sessions the action would take and which it would refuse, and why.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click

from ..actions import ActionReceipt
from ..actions import cancel as cancel_action
from ..actions import retry as retry_action
from ..errors import OtherEngineError, ResumeError, StoreCorrupt, UnknownSessionError, describe_exception
from ..jsontext import lone_surrogate
from ..store.base import SessionInfo
from . import views
from .app import DURATION, command_prefix, db_option, open_store
from .failures import CliError
from .render import fmt_time
from .rowparts import session_command
from .session_ops import (
    CANCEL_REASON,
    SELECTABLE_STATES,
    DryRunStore,
    SessionFinished,
    WouldAct,
    cancel_session,
    live_owner,
    select_sessions,
)
from .worker_cmds import worker_hint

__all__ = ["retry", "cancel", "bulk_options", "for_each_target", "COMMANDS"]


def bulk_options(fn: Any) -> Any:
    """``--workflow``, ``--state``, ``--older-than``, ``--dry-run``, ``--yes``: one set for every bulk action."""
    for option in reversed(
        (
            click.option(
                "--workflow", metavar="NAME", help="Without SESSION: only sessions of this workflow."
            ),
            click.option(
                "--state",
                type=click.Choice(SELECTABLE_STATES),
                help="Without SESSION: only sessions in this state.",
            ),
            click.option(
                "--older-than",
                type=DURATION,
                default=None,
                help="Without SESSION: only sessions last updated this long ago (e.g. 10m).",
            ),
            click.option(
                "--dry-run",
                is_flag=True,
                help="Say what would change (and what would be refused, and why); change nothing.",
            ),
            click.option(
                "--yes", is_flag=True, help="Without SESSION: act on every session the filters select."
            ),
        )
    ):
        fn = option(fn)
    return fn


def _targets(
    store: Any,
    session: str | None,
    workflow: str | None,
    state: str | None,
    older_than: float | None,
    action: str,
) -> list[str] | None:
    """The sessions to act on: SESSION alone, or the filtered set (None: nothing selected,
    said already). A bulk action without a filter is refused: it would touch everything."""
    if session is not None:
        if workflow or state or older_than is not None:
            raise CliError(f"{action}: give SESSION or filters (--workflow, --state, --older-than), not both")
        return [session]
    if not (workflow or state or older_than is not None):
        raise CliError(
            f"{action}: give a SESSION, or filters (--workflow, --state, --older-than) to act on several"
        )
    found: list[SessionInfo] = select_sessions(store, workflow=workflow, state=state, older_than_s=older_than)
    if not found:
        click.echo(f"no session matches the filters; nothing to {action}")
        return None
    return [s.session_id for s in found]


def for_each_target(
    store: Any,
    session: str | None,
    act: Callable[[Any, str], None],
    action: str,
    *,
    workflow: str | None,
    state: str | None,
    older_than: float | None,
    dry_run: bool,
    yes: bool,
) -> None:
    """Run ``act(store, sid)`` on SESSION, or on every session the filters select:
    ``--dry-run`` says what it would do (:func:`_dry_run_targets`), ``--yes`` acts (without it the
    count is said, exit 2). In a bulk action a session that cannot take it (``act`` raised
    a :class:`CliError`) is skipped with one line."""
    sids = _targets(store, session, workflow, state, older_than, action)
    if sids is None:
        return
    if dry_run:
        _dry_run_targets(store, session, sids, act, action)
        return
    if session is None and not yes:
        would, refused = _would_act(store, None, sids, act)  # the dry run's own checks: a true count
        skip = f" and skip {len(refused)}" if refused else ""
        raise CliError(
            f"{action} would act on {len(would)} session(s){skip}: list them with --dry-run, act on them with --yes"
        )
    for sid in sids:
        try:
            act(store, sid)
        except (CliError, StoreCorrupt) as exc:  # a corrupt session is skipped, not the rest with it
            if session is not None:
                raise
            click.echo(f"skipped {sid}: {_why(exc)}")


def _why(exc: CliError | StoreCorrupt) -> str:
    """Why a session is skipped, in one line."""
    return exc.message if isinstance(exc, CliError) else describe_exception(exc)


def _utf8_reason(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """``--reason`` as text the log and every page can hold: an argument with an
    undecodable byte is refused, as ``--input`` and a session id are."""
    if value is not None and lone_surrogate(value) is not None:
        raise click.BadParameter("it holds a byte that is not UTF-8: give the reason as UTF-8 text")
    return value


def _would_act(
    store: Any, session: str | None, sids: list[str], act: Callable[[Any, str], None]
) -> tuple[list[str], list[tuple[str, str]]]:
    """``act`` on each of ``sids`` against a :class:`DryRunStore`: the sessions it would
    take, and those it refuses with why (a refused SESSION given alone raises)."""
    would: list[str] = []
    refused: list[tuple[str, str]] = []
    for sid in sids:
        try:
            act(DryRunStore(store), sid)
        except WouldAct:
            pass
        except (CliError, StoreCorrupt) as exc:
            if session is not None:
                raise CliError(f"would skip {sid}: {_why(exc)}") from None
            refused.append((sid, _why(exc)))
            continue
        would.append(sid)  # it wrote nothing, or was stopped at its first write
    return would, refused


def _dry_run_targets(
    store: Any, session: str | None, sids: list[str], act: Callable[[Any, str], None], action: str
) -> None:
    """``--dry-run``: ``act`` on each of ``sids`` against a :class:`DryRunStore`, which
    stops it at its first write, so the action's own checks say which it would take. Those
    are listed; each one it refuses is a ``would skip SID: why`` line, as the action's
    ``skipped SID: why``. A refused SESSION given alone is an error (exit 2), as the action
    is; any other error of the action's is raised as the action raises it."""
    would, refused = _would_act(store, session, sids, act)
    click.echo(f"would {action} {len(would)} session(s)" + (":" if would else ""))
    for sid in would:
        info = store.session_info(sid)
        if info is not None:
            click.echo(f"  {sid}  {info.workflow}  {info.status}  updated {fmt_time(info.updated_at)}")
    for sid, why in refused:
        click.echo(f"would skip {sid}: {why}")


def _said_retry(store: Any, receipt: ActionReceipt, from_path: str | None) -> str:
    where = f" from {from_path}" if from_path else ""
    if receipt.pending and receipt.owner is not None:
        return (
            f"sent a retry{where} to {receipt.session_id} ({receipt.workflow}): its owner, {receipt.owner.describe()}, "
            "queues it again when its invocation ends"
        )
    _seen, hint = worker_hint(
        store, receipt.workflow, prefix=command_prefix(store.path), session_id=receipt.session_id
    )
    return f"queued {receipt.session_id} ({receipt.workflow}, was {receipt.was}) to run again{where}; {hint}"


@click.command()
@click.argument("session", required=False)
@db_option
@click.option(
    "--from",
    "from_path",
    metavar="PATH",
    help="Run again from this node run (a path, or a node name with one run): it and what follows it run as new attempts.",
)
@click.option(
    "--reason", default=None, callback=_utf8_reason, help="Why: recorded in the log with who asked."
)
@bulk_options
def retry(
    session: str | None,
    db: str | None,
    from_path: str | None,
    reason: str | None,
    workflow: str | None,
    state: str | None,
    older_than: float | None,
    dry_run: bool,
    yes: bool,
) -> None:
    """Run a failed session again (or, with --from, a finished one from a node), without its code.

    Finished runs before the path are kept; the path and what follows it run again as new
    attempts (numbers continue). The session is queued for a worker of its workflow; the log
    records who asked and why (--reason). Exit 0 when queued (or sent to its live owner), 2
    when the session cannot be retried.
    """
    store = open_store(db, write=not dry_run)  # a dry run writes nothing

    def one(target: Any, sid: str) -> None:
        try:
            receipt = retry_action(target, sid, from_path=from_path, reason=reason)
        except (ResumeError, UnknownSessionError) as exc:
            raise CliError(str(exc)) from None
        click.echo(_said_retry(target, receipt, from_path))

    with store:
        for_each_target(
            store,
            session,
            one,
            "retry",
            workflow=workflow,
            state=state,
            older_than=older_than,
            dry_run=dry_run,
            yes=yes,
        )


@click.command()
@click.argument("session", required=False)
@db_option
@click.option(
    "--reason",
    default=CANCEL_REASON,
    show_default=True,
    callback=_utf8_reason,
    help="Why: recorded on every cancelled run, with who asked.",
)
@click.option(
    "--force",
    is_flag=True,
    help="Cancel now even if a live owner holds the session's lease (you know it is dead): its lease is fenced off.",
)
@bulk_options
def cancel(
    session: str | None,
    db: str | None,
    reason: str,
    force: bool,
    workflow: str | None,
    state: str | None,
    older_than: float | None,
    dry_run: bool,
    yes: bool,
) -> None:
    """End a session for good: a paused, queued or orphaned one at once, a live run by its owner.

    Every open run gets a NodeCancelled (with --reason) and the session a RunFinished with
    status cancelled; `resume` refuses it afterwards. A run a live worker executes is
    stopped by that worker at its next lease renewal (within a third of its lease): its
    in-flight nodes are cancelled, never failed. --force takes the session from an owner
    you know is dead instead.
    """
    text = " ".join(reason.split()) or CANCEL_REASON
    store = open_store(db, write=not dry_run)  # a dry run writes nothing
    with store:
        for_each_target(
            store,
            session,
            lambda target, sid: _cancel_one(target, sid, text, force),
            "cancel",
            workflow=workflow,
            state=state,
            older_than=older_than,
            dry_run=dry_run,
            yes=yes,
        )


def _cancel_one(store: Any, sid: str, reason: str, force: bool) -> None:
    if force:
        ws = views.load_session(store, sid)
        held = live_owner(store, sid)
        try:
            before, events = cancel_session(store, ws, reason, force=True)
        except (SessionFinished, OtherEngineError) as exc:
            raise CliError(str(exc)) from None
        if held is not None and held.owner is not None:
            click.echo(
                f"warning: --force: took the session from {held.owner.describe()}, whose lease was current",
                err=True,
            )
        runs = sum(1 for e in events if e.type == "node_cancelled")
        click.echo(
            click.style("cancelled", fg="bright_black")
            + f" {sid} ({before.workflow}, was {before.status}): {runs} open run(s) cancelled"
        )
        return
    try:
        receipt = cancel_action(store, sid, reason)
    except (ResumeError, UnknownSessionError) as exc:
        raise CliError(str(exc)) from None
    if receipt.pending and receipt.owner is not None:
        click.echo(
            f"asked {receipt.owner.describe()}, which runs {sid} ({receipt.workflow}), to stop it: it cancels the run at "
            f"its next lease renewal; see: {session_command(command_prefix(store.path), 'show', sid)}"
        )
        return
    after = views.load_session(store, sid)
    runs = _cancelled_runs(store, sid)
    click.echo(
        click.style("cancelled", fg="bright_black")
        + f" {sid} ({after.workflow}, was {receipt.was}): {runs} open run(s) cancelled"
    )


def _cancelled_runs(store: Any, sid: str) -> int:
    """The NodeCancelled events of the session's last invocation (the cancel's)."""
    events = store.read(sid)
    last = events[-1].invocation_id if events else ""
    return sum(1 for e in events if e.invocation_id == last and e.type == "node_cancelled")


COMMANDS = (retry, cancel)

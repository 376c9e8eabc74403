"""Errors, control-flow signals and the one error classifier.

``classify`` turns an exception into the (code, type, message) triple written on
``NodeErrorEvent`` and ``NodeRetrying``; spans and metrics read those events, so a node
failure is named the same way everywhere.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from .events import UNKNOWN_ERROR

__all__ = [
    "FlowscopeError",
    "WorkflowError",
    "NodeTimeoutError",
    "InvocationAbortedError",
    "ConcurrencyConflict",
    "LeaseLost",
    "LeaseExpired",
    "LeaseHandedOff",
    "OutputNotSerializableError",
    "StateNotSerializableError",
    "RouteNotFoundError",
    "RecoveryLimitError",
    "JobFailedError",
    "StoreError",
    "describe_exception",
    "mask_url_credentials",
    "StoreLocked",
    "StoreCorrupt",
    "NotAFlowscopeDatabase",
    "StoreSchemaTooNew",
    "StoreSchemaTooOld",
    "StoreNotWritable",
    "StoreReadOnly",
    "StoreDiskFull",
    "StoreWalRemoved",
    "StoreUnavailable",
    "UnknownSessionError",
    "ResumeError",
    "SessionCancelledError",
    "OtherEngineError",
    "NodeExitError",
    "ErrorInfo",
    "classify",
    "error_type_name",
    "error_qualname",
    "redact_message",
    "redact_value",
    "redacted_traceback",
    "Redactor",
    "MAX_ERROR_MESSAGE",
    "MAX_ERROR_CODE",
    "MAX_ERROR_TYPE",
    "INVALID_ERROR_CODE",
    "one_line_text",
    "error_code_or_invalid",
]

MAX_ERROR_MESSAGE = 1024
#: An ``error_code`` longer than this is cut on the event (metrics take codes of 64 at most).
MAX_ERROR_CODE = 128
#: What an ``error_code`` that is no identifier is recorded as, everywhere: text with
#: spaces, ``=``, ``/`` or ``@`` is the user's (a message, a path, a secret), and would
#: reach events, spans and the CLI raw. A code of another case or with ``.``, ``:`` or
#: ``-`` (``payment_declined``, ``E-1001``) is kept as the user wrote it (R6).
INVALID_ERROR_CODE = "INVALID_ERROR_CODE"
_CODE_SHAPE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:-]*")
#: ``error_qualname`` (``module.Qualname``) is cut to this many characters.
MAX_ERROR_TYPE = 256

#: ``Runner(redact=...)``: a message in, the message as it may leave the process out.
Redactor = Callable[[str], str]


class FlowscopeError(Exception):
    """Base class of the errors flowscope raises."""


class WorkflowError(FlowscopeError):
    """A workflow is malformed or finished in an inconsistent state (e.g. two terminal outputs)."""

    error_code = "WORKFLOW_ERROR"


class NodeTimeoutError(FlowscopeError):
    """A node attempt ran longer than its ``timeout``."""

    error_code = "NODE_TIMEOUT"


class OutputNotSerializableError(FlowscopeError):
    """A node returned an output the store cannot keep (not JSON-serialisable)."""

    error_code = "OUTPUT_NOT_SERIALIZABLE"


class StateNotSerializableError(FlowscopeError):
    """A node set a ``ctx.state`` value (or key) the store cannot keep (not JSON)."""

    error_code = "STATE_NOT_SERIALIZABLE"


class RouteNotFoundError(FlowscopeError):
    """A node returned a ``Route`` whose label matches none of its outgoing edges."""

    error_code = "ROUTE_NOT_FOUND"


class RecoveryLimitError(FlowscopeError):
    """A run was recovered after a crash more often than ``Runner(max_recoveries=...)`` allows."""

    error_code = "RECOVERY_LIMIT"


class NodeExitError(FlowscopeError):
    """A node's body raised a ``BaseException`` that is no signal of the engine's:
    ``sys.exit()`` (argparse on bad arguments), a library's own. It is recorded as the
    node's failure (under its own type name) and raised on as this ``Exception``: asyncio
    lets ``SystemExit`` out of any task, which would stop every session of the loop."""


class JobFailedError(FlowscopeError):
    """A long-running external job failed and the operator chose to abort."""

    error_code = "JOB_FAILED"


class ResumeError(FlowscopeError):
    """``resume()`` was asked for something the session cannot give (unknown input or job id)."""


class OtherEngineError(ResumeError):
    """The session is run by another engine (LangGraph, ADK) whose bridge records it:
    flowscope's answers, retries, cancels and resumes would reach its log, never the
    engine, so they are refused; the engine continues the session."""


class SessionCancelledError(ResumeError):
    """The session was cancelled (by ``flowscope cancel`` or ``flowscope.cancel()``): it is
    over for good, and nothing runs it again."""


class StoreError(FlowscopeError):
    """The event store cannot be used: missing, corrupt or foreign database, bad row."""


class StoreLocked(StoreError):
    """Another connection held a lock past the store's busy timeout; retry later."""


class StoreCorrupt(StoreError):
    """The database file is damaged (a torn page, a bad header); restore it from a backup."""


class NotAFlowscopeDatabase(StoreError):
    """The file or database exists but was not written by flowscope (or is not a database at all)."""


class StoreSchemaTooNew(StoreError):
    """The database was migrated by a newer flowscope; upgrade this one before using it."""


class StoreSchemaTooOld(StoreError):
    """The database has an older schema and was opened read-only, which cannot migrate it:
    the first writable open does (a worker, a ``Runner``, a command that writes)."""


class StoreNotWritable(StoreError):
    """The store refuses writes for a reason outside flowscope (a full disk, a read-only
    file, mount, role or server) while it may still be read. Nothing was written; what
    was committed stays. A worker backs off on it and stops when it lasts (docs/workers.md)."""


class StoreReadOnly(StoreNotWritable):
    """The store cannot be written: a read-only file, mount or role."""


class StoreDiskFull(StoreNotWritable):
    """The disk (or the database's quota) is full; free space and resume."""


class StoreWalRemoved(StoreNotWritable):
    """A SQLite database's ``-wal`` file was deleted (or replaced) while a process had the
    database open: that process's commits since the last checkpoint are in a file nobody
    else can see, and vanish when it closes. Nothing more is written through it."""


class StoreUnavailable(StoreError):
    """The store cannot be reached or opened (a missing file, a server that does not answer)."""


class UnknownSessionError(StoreError, KeyError):
    """No events are stored for this session id."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else "unknown session"


class ConcurrencyConflict(StoreError):
    """Another writer appended to the session first; nothing was written (R10, docs/design.md)."""


class LeaseLost(ConcurrencyConflict):
    """The caller's lease on the session was superseded: another owner took the session
    over (its epoch advanced), so this append or renewal was refused and nothing was written."""


class LeaseHandedOff(LeaseLost):
    """The owner let the session go without a call to the store (a worker's drain while its
    store does not answer): the invocation stops and records nothing more, and its lease
    expires by itself, so that another owner takes the session as a crashed one."""


class LeaseExpired(LeaseLost):
    """The caller's lease may have expired by its own clock before it was renewed (the
    process was stopped, its renewals failed or came too late, the clock jumped), so
    another owner may have taken the session over: the invocation stops without asking
    the store. It starts no node body and records nothing more; its runs are cancelled."""


class InvocationAbortedError(BaseException):
    """The invocation was aborted. A ``BaseException`` so ``except Exception`` cannot swallow it."""


@dataclass(frozen=True, slots=True)
class ErrorInfo:
    """How a failure is named in events, spans and metrics."""

    code: str
    type: str
    message: str
    #: ``module.Qualname`` (a builtin's bare name): what spans show as ``error.type``
    qualname: str = ""


def error_type_name(exc: BaseException) -> str:
    """``type(e).__name__``: the name ``RetryConfig.exceptions`` matches and ``error_type`` shows."""
    return type(exc).__name__


def error_qualname(exc: BaseException) -> str:
    """The exception's fully qualified class name, ``module.Qualname``
    (``myapp.payments.CardDeclined``), with a builtin's name bare (``ValueError``), as the
    OpenTelemetry ``error.type`` and ``exception.type`` conventions ask: two classes of one
    name in different modules stay apart on spans. Recorded beside ``error_type``."""
    cls = type(exc)
    try:  # a hostile metaclass may make these raise, or be anything: then the bare name
        module, qualname = cls.__module__, cls.__qualname__
    except Exception:
        return cls.__name__
    name = str.__str__(qualname) if isinstance(qualname, str) and qualname else cls.__name__
    if not isinstance(module, str) or not module or module == "builtins":
        return name[:MAX_ERROR_TYPE]
    return f"{str.__str__(module)}.{name}"[:MAX_ERROR_TYPE]


#: A URL's ``user:password@``. The password runs to the last ``@`` before whitespace: an
#: unencoded ``#``, ``?``, ``/`` or ``@`` in it (libpq takes a ``#`` or ``?``) must not end it
#: early and let its tail out. Masking a little more of a rare URL is the safe side.
_URL_CREDENTIALS = re.compile(r"\b([a-zA-Z][a-zA-Z0-9+.-]*://)([^\s/@:]*):\S*@")
#: A URL's userinfo without a password (``https://ghp_x@github.com``): often a token in
#: the user's place, so it is masked whole, as pip does.
_URL_USER = re.compile(r"\b([a-zA-Z][a-zA-Z0-9+.-]*://)[^\s/@:]+@")
#: The names of secrets, in every rule below that masks a value by its name.
_SECRET_NAMES = (
    r"password|passwd|passphrase|pwd|secret|token|api[_-]?key|access[_-]?key"
    r"|credentials?|auth|cookie"
)
#: A path's part after a space when a ``/`` (or ``\``) follows it in the same word
#: (``/srv/My Documents/x``): a directory with a space in its name. A file name's part
#: after its last space cannot be told from the sentence's next word, and stays.
_SPACED_DIRS = r"(?: [^\s/\\'\"]+[/\\][^\s'\"]*)*"
#: A query parameter that names a secret (``?password=``, ``&sslpassword=``, ``?api_key=``,
#: ``?access_token=``): its value is masked as a URL's password is, to the next ``&`` or
#: space (libpq takes a ``#`` in it as it is: it must not end the mask early).
_QUERY_SECRET = re.compile(rf"([?&][\w.-]*?(?:{_SECRET_NAMES})=)[^&\s]*", re.IGNORECASE)


def mask_url_credentials(text: str) -> str:
    """``text`` with every URL's password replaced by ``***`` (``scheme://user:***@host``),
    and the value of every query parameter that names a secret (``?sslpassword=***``):
    what the CLI does to every line it prints that may name a URL."""
    return _QUERY_SECRET.sub(r"\1***", _URL_CREDENTIALS.sub(r"\1\2:***@", text))


# The default redaction (R13, docs/design.md): credential shapes first (a URL's user:password
# before its path is looked at), then absolute file paths. Each pattern is anchored on
# what precedes it so that relative run paths ("w@1/check@1") and URLs' own paths stay.
_REDACTIONS: tuple[tuple[re.Pattern[str], str | Callable[[re.Match[str]], str]], ...] = (
    (_URL_CREDENTIALS, r"\1***:***@"),
    (_URL_USER, r"\1***@"),
    # An Authorization header's scheme and credentials ("token revoked" is prose, not one).
    (re.compile(r"\b((?i:bearer|basic)|Token)\s+[A-Za-z0-9._~+/=-]{8,}"), r"\1 ***"),
    (re.compile(r"\bsk-[A-Za-z0-9_-]{6,}"), "sk-***"),
    (re.compile(r"\b(AKIA|ASIA)[A-Z0-9]{12,}"), r"\1***"),
    # A secret's name and its value: ``password=x``, ``"password": "x"`` in JSON,
    # ``'api_key': 'x'`` in a repr, env-style names that end in one (``DB_PASSWORD=``,
    # ``GITHUB_TOKEN=``, ``AWS_SECRET_ACCESS_KEY=``, ``client_secret=``) and URL query
    # tokens (``?access_token=``). A quoted value keeps its quotes.
    (
        re.compile(
            rf"(?<![A-Za-z0-9])([\w-]*?(?:{_SECRET_NAMES}|[_-]key))"
            r"([\"']?\s*[=:]\s*)(\"[^\"]*\"|'[^']*'|[^\s,;&'\"}\])]+)",
            re.IGNORECASE,
        ),
        lambda m: (
            m.group(1)
            + m.group(2)
            + (m.group(3)[0] + "***" + m.group(3)[0] if m.group(3)[0] in "\"'" else "***")
        ),
    ),
    # File URLs (file:///x, sqlite:////x), Windows paths (C:\x, C:/x, \\host\x), then
    # absolute paths, after a colon too (path:/x) but for a URL's "//" (a path's trailing
    # colon is the sentence's: "/x/flowscope.db: the disk is full"). A path ends at a space
    # but for a directory's (_SPACED_DIRS); one that starts "//" is a path all the same.
    (re.compile(rf"(?i)\b(?:file|sqlite):/{{2,}}[^\s'\"]*{_SPACED_DIRS}"), "<path>"),
    (re.compile(rf"(?<![\w])(?:[A-Za-z]:\\|\\\\)[^\s'\"]+{_SPACED_DIRS}"), "<path>"),
    # after a colon (C:/x/y, path:/x/y) a path has two parts at least: "mode r:/w" is none
    (re.compile(rf"(?<=[^/:\s]:)/[^\s/'\"]+/[^\s'\"]*{_SPACED_DIRS}(?<!:)"), "<path>"),
    (re.compile(rf"(?<![\w.@~:/-])~?/+[^\s/'\"]+(?:/[^\s/'\"]*)*{_SPACED_DIRS}(?<!:)"), "<path>"),
)


def redact_message(text: str) -> str:
    """The default redaction: absolute file paths become ``<path>``, and credential shapes
    (``Bearer ...``, ``sk-...``, ``AKIA...``, ``password=...``, a URL's ``user:password@``)
    become ``***``. Every message flowscope records passes through it (or through
    ``Runner(redact=...)``), so events, spans, metrics, exports and the CLI get it once."""
    for pattern, repl in _REDACTIONS:
        text = pattern.sub(repl, text)
    return text


#: A key naming a secret, for :func:`redact_value` (the names the pattern above knows).
_SECRET_KEY = re.compile(rf"(?i)(?:{_SECRET_NAMES}|private[_-]?key)$")


def redact_value(value: Any) -> Any:
    """:func:`redact_message` through a JSON value: every string redacted, and the value
    of a key that names a secret (``{"password": ...}``) replaced by ``***``. For errors
    that come as objects (a job's), whose JSON text would hide its quotes from the patterns."""
    if isinstance(value, str):
        return redact_message(value)
    if isinstance(value, Mapping):
        return {
            k: "***" if isinstance(k, str) and _SECRET_KEY.search(k) else redact_value(v)
            for k, v in value.items()
        }
    if isinstance(value, (list, tuple)):
        return [redact_value(v) for v in value]
    return value


def _message(exc: BaseException, redact: Redactor) -> str:
    try:
        text = str(exc)
    except Exception:  # a broken __str__ must not hide the failure it describes
        text = ""
    if not isinstance(text, str) or not text:
        return type(exc).__name__
    # Bound the work of the redaction on a huge message, then redact, then cut.
    text = text[: 8 * MAX_ERROR_MESSAGE]
    try:
        text = redact(text)
    except Exception:  # a redactor that fails must not let the raw message out
        return f"{type(exc).__name__} (message withheld: the redaction failed)"
    if not isinstance(text, str):
        return f"{type(exc).__name__} (message withheld: the redaction did not return a str)"
    return text[:MAX_ERROR_MESSAGE] or type(exc).__name__


_BREAKS = re.compile(r"\s*[\r\n\v\f]+\s*")


#: What a terminal acts on rather than prints (ESC starts a sequence that clears the
#: screen, sets the window title or writes the clipboard): C0 (a tab becomes a space), DEL and C1.
_CONTROLS = re.compile(r"[\x00-\x08\x0e-\x1f\x7f-\x9f]")


def one_line_text(text: str) -> str:
    """Line breaks (and the blanks around them) as one space: one cell never breaks a
    table's lines; other spacing (a timeline bar's) is kept. Any other control character
    is shown as ``\\xNN``: an error message is the user's text, never the terminal's orders."""
    text = _BREAKS.sub(" ", text)
    if _CONTROLS.search(text) is None:
        return text.replace("\t", " ")
    return _CONTROLS.sub(lambda m: f"\\x{ord(m.group()):02x}", text).replace("\t", " ")


def describe_exception(exc: BaseException) -> str:
    """One redacted log line for ``exc``: ``Type: message``, the message through the default
    redaction; an exception whose ``__str__`` raises is said to be one, never a traceback.
    Log lines use it because a raw ``%s`` of an exception prints whatever secret it holds."""
    name = error_type_name(exc)
    try:
        str(exc)
    except Exception as broken:  # a hostile __str__: say so in one line
        return f"{name} (its message could not be read: str() raised {error_type_name(broken)})"
    message = _message(exc, redact_message)  # the class name when there is no message
    # one line indeed: a message's line break would forge the next log line, its ESC
    # sequences drive the terminal of whoever tails the log
    return name if message == name else f"{name}: {one_line_text(message)}"


def error_code_or_invalid(code: str) -> str:
    """``code`` (cut to ``MAX_ERROR_CODE``) if it is an identifier (letters, digits and
    ``_.:-``), else ``INVALID_ERROR_CODE``: the one rule for what an ``error_code`` may hold.
    (A metric label is stricter still: ``observability.labels.code_label``.)"""
    code = code[:MAX_ERROR_CODE]
    return code if _CODE_SHAPE.fullmatch(code) else INVALID_ERROR_CODE


def _code(exc: BaseException, mapping: Mapping[type, str] | None) -> str:
    try:  # a hostile exception's error_code property may raise: then it has none
        code = getattr(exc, "error_code", None)
        if isinstance(code, str) and code:
            return error_code_or_invalid(str.__str__(code))
    except Exception:
        pass
    if mapping:
        for klass in type(exc).__mro__:
            mapped = mapping.get(klass)
            if mapped:
                return error_code_or_invalid(mapped)
    return UNKNOWN_ERROR


def classify(
    exc: BaseException, mapping: Mapping[type, str] | None = None, redact: Redactor = redact_message
) -> ErrorInfo:
    """Name a failure (R6, R13, docs/design.md).

    The code is the exception's ``error_code`` attribute when it is a non-empty string
    (one that raises counts as none), else the first match of ``mapping`` along the MRO,
    else ``UNKNOWN_ERROR`` (never the class name, which ``type`` already carries); a code
    that is no identifier is ``INVALID_ERROR_CODE`` (:func:`error_code_or_invalid`). The message is ``str(e)``, or the class name when that is
    empty or raises, passed through ``redact`` and cut to 1,024 characters. No traceback,
    ever.
    """
    return ErrorInfo(_code(exc, mapping), error_type_name(exc), _message(exc, redact), error_qualname(exc))


_CAUSED = "\nThe above exception was the direct cause of the following exception:\n\n"
_DURING = "\nDuring handling of the above exception, another exception occurred:\n\n"


def redacted_traceback(exc: BaseException, redact: Redactor = redact_message) -> str:
    """``exc``'s traceback as Python prints it, the exceptions it was raised from or
    during included, with each exception's own text through ``redact`` as :func:`classify`
    passes it (the frames' files and code stay: what a stack trace is asked for)."""
    import traceback

    blocks: list[str] = []
    seen: set[int] = set()
    e: BaseException | None = exc
    while e is not None:  # from the last raised back to the first
        seen.add(id(e))
        tb = e.__traceback__
        block = "Traceback (most recent call last):\n" + "".join(traceback.format_tb(tb)) if tb else ""
        block += f"{error_qualname(e)}: {_message(e, redact)}\n"
        if e.__cause__ is not None:
            e, joint = e.__cause__, _CAUSED
        elif e.__context__ is not None and not e.__suppress_context__:
            e, joint = e.__context__, _DURING
        else:
            e, joint = None, ""
        if e is not None and id(e) in seen:
            e, joint = None, ""
        blocks.append(joint + block)  # printed after the one it came from
    return "".join(reversed(blocks))

"""Bad input, odd values and hostile messages get a clear answer and lose nothing.

One test per bullet of the issue (routes, state, outputs across resume, redaction,
bounded labels, phantom failures, hostile exceptions, names and ids, wide fan-outs, the
store file under operations, the CLI's own output); the table of hostile values is in
``test_hostile_table.py``.
"""

from __future__ import annotations

import math
import sqlite3

import pytest

from commands import FLOWSCOPE, cli_env, run_cli
from conftest import of_type, unavailable
from flowscope import START, RetryConfig, Route, Runner, Workflow, node
from flowscope.errors import OutputNotSerializableError, RouteNotFoundError, StateNotSerializableError
from flowscope.store import SqliteEventStore, rebuild


@pytest.fixture
def db(tmp_path):
    return SqliteEventStore(tmp_path / "h.db")


def invalid_json_rows(path) -> int:
    with sqlite3.connect(path) as conn:
        return conn.execute("SELECT count(*) FROM events WHERE NOT json_valid(payload)").fetchone()[0]


# -- routes --------------------------------------------------------------------------------------


async def test_route_label_with_no_edge_fails_the_node_naming_the_labels(db):
    check = node(lambda x: Route("maybe", x), name="check")
    ok, no = node(lambda x: "ok", name="ok"), node(lambda x: "no", name="no")
    wf = Workflow("w", edges=[(START, check, {"yes": ok, "no": no})])
    with pytest.raises(RouteNotFoundError) as info:
        await Runner(wf, store=db).run(1, session_id="s")
    (err,) = of_type(db.read("s"), "node_error")
    assert (err.path, err.error_code) == ("w@1/check@1", "ROUTE_NOT_FOUND")
    assert "'maybe'" in err.error_message and "'yes'" in err.error_message and "'no'" in err.error_message
    assert str(info.value) == err.error_message
    assert [e.path for e in of_type(db.read("s"), "node_completed")] == []  # nothing ran on unrouted
    assert rebuild(db.read("s")).status == "failed"


async def test_route_labels_compare_as_the_edges_declare_them(db):
    pick = node(lambda x: Route(x), name="pick")
    one, two = node(lambda x: "int one", name="one"), node(lambda x: "str two", name="two")
    wf = Workflow("w", edges=[(START, pick, {1: one, "2": two})])
    runner = Runner(wf, store=db)
    assert (await runner.run(1, session_id="a")).output == "int one"
    assert (await runner.run("2", session_id="b")).output == "str two"
    with pytest.raises(RouteNotFoundError):  # "1" is not 1, and True is not 1
        await runner.run("1", session_id="c")
    with pytest.raises(RouteNotFoundError):
        await runner.run(True, session_id="d")


# -- state ---------------------------------------------------------------------------------------


async def test_state_value_not_json_fails_the_node_naming_the_key_and_keeps_valid_keys(tmp_path):
    path = tmp_path / "s.db"

    @node
    def setter(ctx, x):
        ctx.state["good"] = 1
        ctx.state["bad"] = {1, 2}
        return x

    wf = Workflow("w", edges=[(START, setter)])
    with pytest.raises(StateNotSerializableError):
        await Runner(wf, store=SqliteEventStore(path)).run(0, session_id="s")
    store = SqliteEventStore(path)
    (err,) = of_type(store.read("s"), "node_error")
    assert (err.path, err.error_code) == ("w@1/setter@1", "STATE_NOT_SERIALIZABLE")
    assert "'bad'" in err.error_message
    assert rebuild(store.read("s")).state == {"good": 1}  # the valid key is on record

    @node
    def mutator(ctx, x):  # a list made unserialisable after it was set
        ctx.state["items"] = []
        ctx.state["items"].append(object())
        return x

    with pytest.raises(StateNotSerializableError, match="'items'"):
        await Runner(Workflow("m", edges=[(START, mutator)]), store=store).run(0, session_id="m")
    assert of_type(store.read("m"), "node_error")[0].error_code == "STATE_NOT_SERIALIZABLE"


# -- outputs across resume -----------------------------------------------------------------------


async def test_outputs_are_the_same_live_and_after_resume(tmp_path):
    path = tmp_path / "o.db"
    seen: list = []

    @node
    def make(x):
        return {1: "one", "t": (1, 2), "n": [(3, {"k": (4,)})]}

    @node
    async def use(ctx, x):
        seen.append(x)
        await ctx.request_input("go?")
        return x

    wf = Workflow("w", edges=[(START, make, use)])
    first = await Runner(wf, store=SqliteEventStore(path)).run(None, session_id="s")
    assert first.status == "paused"
    done = await Runner(wf, store=SqliteEventStore(path)).resume("s", inputs={"w@1/use@1": True})
    expected = {"1": "one", "t": [1, 2], "n": [[3, {"k": [4]}]]}
    assert seen == [expected, expected]  # live, then replayed from the store
    assert done.output == expected


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf, {"x": [1.0, math.nan]}])
async def test_nan_and_infinity_are_refused_and_every_payload_stays_valid_json(tmp_path, bad):
    path = tmp_path / "n.db"
    wf = Workflow("w", edges=[(START, node(lambda x: bad, name="f"))])
    with pytest.raises(OutputNotSerializableError):
        await Runner(wf, store=SqliteEventStore(path)).run(0, session_id="s")
    (err,) = of_type(SqliteEventStore(path).read("s"), "node_error")
    assert err.error_code == "OUTPUT_NOT_SERIALIZABLE"
    assert invalid_json_rows(path) == 0
    with sqlite3.connect(path) as conn:  # the ad-hoc SQL the store documents works
        conn.execute("SELECT json_extract(payload, '$.error_code') FROM events").fetchall()


async def test_output_nested_10000_deep_is_not_serializable_and_not_retried(db):
    def deep(x):
        v: list = []
        for _ in range(10_000):
            v = [v]
        return v

    wf = Workflow(
        "w", edges=[(START, node(deep, name="deep", retry=RetryConfig(max_attempts=3, initial_delay=0)))]
    )
    with pytest.raises(OutputNotSerializableError, match="nested too deeply"):
        await Runner(wf, store=db).run(0, session_id="s")
    events = db.read("s")
    (err,) = of_type(events, "node_error")
    assert (err.error_code, err.attempt_count) == ("OUTPUT_NOT_SERIALIZABLE", 1)
    assert of_type(events, "node_retrying") == []


# -- messages that leave the process -------------------------------------------------------------

SECRETS = (
    "hunter2",
    "sk-live-0123456789abcdef",
    "AKIAIOSFODNN7EXAMPLE",
    "eyJhbGciOi.payload.sig",
    "/srv/app/secret-dir",
)


def leaky(x):
    if x == "file":
        open("/srv/app/secret-dir/config.yaml")  # FileNotFoundError naming the path
    raise RuntimeError(
        "POST https://bob:hunter2@api.example.com/v1 failed; key sk-live-0123456789abcdef, "
        "aws AKIAIOSFODNN7EXAMPLE, Authorization: Bearer eyJhbGciOi.payload.sig, password=hunter2"
    )


@pytest.mark.parametrize("case", ["credentials", "file"])
async def test_messages_are_redacted_in_store_spans_export_and_cli(tmp_path, case):
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
    from test_cli import invoke

    from flowscope.observability import TracingPlugin

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    path = tmp_path / "r.db"
    inner = Workflow(
        "inner", edges=[(START, node(leaky, name="leak", retry=RetryConfig(max_attempts=2, initial_delay=0)))]
    )
    wf = Workflow("w", edges=[(START, inner)])
    with pytest.raises((RuntimeError, FileNotFoundError)):
        await Runner(wf, store=SqliteEventStore(path), plugins=[TracingPlugin(tracer_provider=provider)]).run(
            case, session_id="s"
        )
    texts = {"sqlite file": path.read_bytes().decode("utf-8", "replace")}
    for span in exporter.get_finished_spans():
        texts[f"span {span.name}"] = " ".join(
            [str(dict(span.attributes or {})), str(span.status.description)]
            + [str(dict(ev.attributes or {})) for ev in span.events]
        )
    texts["export"] = invoke("--db", str(path), "export", "s").stdout
    texts["show"] = invoke("--db", str(path), "show", "s", "--format", "json").stdout
    for where, text in texts.items():
        for secret in SECRETS:
            assert secret not in text, (where, secret)
    err = of_type(SqliteEventStore(path).read("s"), "node_error")[0]
    assert "<path>" in err.error_message if case == "file" else "***" in err.error_message
    retrying = of_type(SqliteEventStore(path).read("s"), "node_retrying")[0]
    assert retrying.error_message == err.error_message


async def test_runner_redact_hook_replaces_the_default_and_a_failing_one_withholds(db):
    wf = Workflow("w", edges=[(START, node(leaky, name="leak"))])
    with pytest.raises(RuntimeError):
        await Runner(wf, store=db, redact=lambda s: s.replace("bob", "B")[:20]).run(0, session_id="a")
    assert of_type(db.read("a"), "node_error")[0].error_message == "POST https://B:hunte"

    def broken(s):
        raise ValueError("redactor bug")

    with pytest.raises(RuntimeError):
        await Runner(wf, store=db, redact=broken).run(0, session_id="b")
    msg = of_type(db.read("b"), "node_error")[0].error_message
    assert msg == "RuntimeError (message withheld: the redaction failed)"


def test_default_redaction_keeps_run_paths_and_plain_text():
    from flowscope.errors import redact_message

    assert redact_message("w@1/check@1 failed: 1 / 2 and/or ./rel/x at http://host:80/metrics") == (
        "w@1/check@1 failed: 1 / 2 and/or ./rel/x at http://host:80/metrics"
    )
    assert redact_message("open '/etc/passwd' and ~/.ssh/id and C:\\Users\\bob\\f.txt") == (
        "open '<path>' and <path> and <path>"
    )


# -- hostile exceptions --------------------------------------------------------------------------


class CodeRaises(Exception):
    @property
    def error_code(self):
        raise RuntimeError("error_code is broken")


async def test_exception_whose_error_code_raises_is_unknown_error_at_its_own_path(db):
    def bad(x):
        raise CodeRaises("boom")

    inner = Workflow("inner", edges=[(START, node(bad, name="leaf"))])
    wf = Workflow("w", edges=[(START, inner)])
    with pytest.raises(CodeRaises):
        await Runner(wf, store=db).run(0, session_id="s")
    events = db.read("s")
    (err,) = of_type(events, "node_error")
    assert (err.path, err.error_type, err.error_code, err.error_message) == (
        "w@1/inner@1/leaf@1",
        "CodeRaises",
        "UNKNOWN_ERROR",
        "boom",
    )
    started = {e.path for e in of_type(events, "node_started")}
    ended = {
        e.path
        for e in events
        if e.type in ("node_completed", "node_error", "node_error_propagated", "node_cancelled")
    }
    assert started == ended  # every NodeStarted has its one terminal event
    assert rebuild(events).nodes["w@1/inner@1/leaf@1"].status == "failed"


# -- names and ids -------------------------------------------------------------------------------

BAD_IDS = [
    "bad\ud800id",
    "nul\x00id",
    "x" * 257,
    "tab\tid",
    42,
    ".",
    "..",
]  # "." and "..": steps of a URL path


@pytest.mark.parametrize("sid", BAD_IDS)
async def test_session_id_that_cannot_be_stored_is_a_value_error_before_anything_is_appended(db, sid):
    wf = Workflow("w", edges=[(START, node(lambda x: x, name="a"))])
    runner = Runner(wf, store=db)
    before = db.list_sessions() if hasattr(db, "list_sessions") else None
    for call in (lambda: runner.run(1, session_id=sid), lambda: runner.resume(sid)):
        with pytest.raises(ValueError, match="session id"):
            await call()
    with pytest.raises(ValueError, match="session id"):
        runner.submit(1, session_id=sid)
    if before is not None:
        assert db.list_sessions() == before
    with sqlite3.connect(db.path) as conn:
        assert conn.execute("SELECT count(*) FROM events").fetchone()[0] == 0


@pytest.mark.parametrize("name", ["bad\ud800name", "nul\x00name", "n" * 201, "line\nbreak"])
def test_node_name_that_cannot_be_stored_is_a_value_error_naming_the_problem(name):
    with pytest.raises(ValueError, match="node name") as info:
        node(lambda x: x, name=name)
    assert any(w in str(info.value) for w in ("surrogate", "control character", "characters long"))
    with pytest.raises(ValueError, match="node name"):
        Workflow(name, edges=[(START, node(lambda x: x, name="a"))])


# -- wide fan-outs -------------------------------------------------------------------------------


@pytest.mark.slow
async def test_a_20000_wide_fan_out_runs_max_steps_bounds_loops_not_width(db):
    from flowscope import JoinNode

    width = 20_000
    src = node(lambda x: x, name="src")
    branches = tuple(node(lambda x, i=i: i, name=f"b{i}") for i in range(width))
    join = JoinNode("join", lambda d: sum(d.values()))
    wf = Workflow("wide", edges=[(START, src, branches, join)])
    result = await Runner(wf, store=db).run(0, session_id="s")
    assert result.output == sum(range(width))
    assert len(of_type(db.read("s"), "node_completed")) == width + 3
    # ... and a loop is still stopped by max_steps (steps, not runs)
    again = node(lambda n: Route("again", n + 1), name="again")
    loop = Workflow("loop", edges=[(START, again, {"again": again})], max_steps=50)
    with pytest.raises(Exception, match="max_steps=50"):
        await Runner(loop, store=db).run(0, session_id="loop")


# -- no phantom failures -------------------------------------------------------------------------


async def test_a_resume_that_loses_a_race_counts_one_conflict_and_no_failure(tmp_path):
    import asyncio

    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
    from opentelemetry.trace import StatusCode
    from prometheus_client import CollectorRegistry

    from flowscope.errors import ConcurrencyConflict
    from flowscope.observability import MetricsPlugin, TracingPlugin

    path = tmp_path / "race.db"
    gate = asyncio.Event()
    calls = []

    @node
    async def ask(ctx, x):
        return await ctx.request_input("go?")

    @node
    async def slow(x):
        calls.append(x)
        if len(calls) == 1:  # the first resume waits here while the second one wins
            await gate.wait()
        return x

    wf = Workflow("w", edges=[(START, ask, slow)])
    await Runner(wf, store=SqliteEventStore(path)).run(0, session_id="s")

    def observed():
        exporter = InMemorySpanExporter()
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(exporter))
        registry = CollectorRegistry()
        return registry, exporter, [TracingPlugin(tracer_provider=provider), MetricsPlugin(registry=registry)]

    reg_a, spans_a, plugins_a = observed()
    reg_c, spans_c, plugins_c = observed()
    loser = asyncio.ensure_future(
        Runner(wf, store=SqliteEventStore(path), plugins=plugins_a).resume("s", inputs={"w@1/ask@1": 1})
    )
    while not calls:
        await asyncio.sleep(0.01)
    with pytest.raises(ConcurrencyConflict):  # refused at the start: the first resume's owner is alive
        await Runner(wf, store=SqliteEventStore(path), plugins=plugins_c).resume("s")
    winner = await Runner(wf, store=SqliteEventStore(path)).resume("s", force=True)
    assert winner.status == "completed"
    before = SqliteEventStore(path).read("s")
    gate.set()
    with pytest.raises(ConcurrencyConflict):
        await loser
    assert SqliteEventStore(path).read("s") == before  # the loser appended nothing more

    for reg, spans in ((reg_a, spans_a), (reg_c, spans_c)):
        assert reg.get_sample_value("flowscope_resume_conflicts_total", {"workflow": "w"}) == 1
        assert not reg.get_sample_value(
            "flowscope_workflow_runs_total", {"workflow": "w", "outcome": "failed"}
        )
        for outcome in ("failure", "timeout"):
            for n in ("ask", "slow", "w"):
                assert not reg.get_sample_value(
                    "flowscope_node_runs_total", {"workflow": "w", "node": n, "outcome": outcome}
                )
        assert [s.name for s in spans.get_finished_spans() if s.status.status_code == StatusCode.ERROR] == []
        assert "UNKNOWN_ERROR" not in str([dict(s.attributes or {}) for s in spans.get_finished_spans()])


# -- bounded labels ------------------------------------------------------------------------------


class OddCode(Exception):
    def __init__(self, code):
        super().__init__(f"code {code[:10]}")
        self.error_code = code


async def test_metric_labels_are_bounded_codes_look_like_codes_and_series_fold_into_other(db):
    from prometheus_client import CollectorRegistry

    from flowscope.observability import MetricsPlugin

    registry = CollectorRegistry()
    metrics = MetricsPlugin(registry=registry, max_series=20)
    codes = ["lower_case", "HAS SPACE", "A" * 65, "9STARTS_WITH_DIGIT", "OK_CODE"]

    def fail(code):
        def fn(x):
            raise OddCode(code)

        return fn

    for i, code in enumerate(codes):
        wf = Workflow("w", edges=[(START, node(fail(code), name="f"))])
        with pytest.raises(OddCode):
            await Runner(wf, store=db, plugins=[metrics]).run(0, session_id=f"c{i}")
    labels = {
        s.labels["error_code"]
        for m in registry.collect()
        if m.name == "flowscope_node_errors"
        for s in m.samples
    }
    assert labels == {"INVALID_ERROR_CODE", "OK_CODE"}
    kept = [of_type(db.read(f"c{i}"), "node_error")[0].error_code for i in range(len(codes))]
    # the event keeps an identifier as written (R6); text that is none (a space) is no code
    assert kept == ["lower_case", "INVALID_ERROR_CODE", "A" * 65, "9STARTS_WITH_DIGIT", "OK_CODE"]

    @node
    async def fan(ctx, n):
        for i in range(n):
            await ctx.run_node(node(lambda x: x, name=f"child{i}"), i)
        return n

    await Runner(Workflow("dyn", edges=[(START, fan)]), store=db, plugins=[metrics]).run(
        100, session_id="dyn"
    )
    for metric in ("flowscope_node_runs", "flowscope_node_duration_seconds", "flowscope_nodes_running"):
        (m,) = [m for m in registry.collect() if m.name == metric]
        label_sets = {tuple(sorted((k, v) for k, v in s.labels.items() if k != "le")) for s in m.samples}
        assert len(label_sets) <= 21, metric  # max_series, plus the one _other set
        assert any(dict(ls).get("node") == "_other" for ls in label_sets), metric
    overflow = registry.get_sample_value(
        "flowscope_metrics_overflow_total", {"metric": "flowscope_node_runs_total"}
    )
    assert overflow and overflow >= 80


# -- the store file under operations -------------------------------------------------------------


async def paused_sessions(path, ids=("sess-a", "sess-b")):
    @node
    async def ask(ctx, x):
        return await ctx.request_input("go?")

    wf = Workflow("w", edges=[(START, ask)])
    for sid in ids:
        with SqliteEventStore(path) as store:
            await Runner(wf, store=store).run(1, session_id=sid)
    return wf


@pytest.mark.slow
async def test_read_only_commands_open_a_wal_database_on_read_only_storage(tmp_path):
    import os
    import shutil
    import subprocess

    from test_cli import invoke

    folder = tmp_path / "ro"
    folder.mkdir()
    path = folder / "f.db"
    await paused_sessions(path)
    assert not (folder / "f.db-shm").exists()  # closed cleanly: SQLite must create it to read
    if os.geteuid() != 0 or shutil.which("chattr") is None:
        unavailable("needs root and chattr to make the folder immutable")
    if subprocess.run(["chattr", "+i", str(folder)], capture_output=True).returncode != 0:
        unavailable("this filesystem has no immutable flag")
    try:
        result = invoke("--db", str(path), "runs", "--format", "json")
        assert result.exit_code == 0, result.output
        assert {r["session_id"] for r in __import__("json").loads(result.stdout)} == {"sess-a", "sess-b"}
        assert invoke("--db", str(path), "stuck", "--older-than", "0s").exit_code == 0
        assert SqliteEventStore(path, readonly=True).read("sess-a")
    finally:
        subprocess.run(["chattr", "-i", str(folder)], check=True)


async def test_store_collector_follows_a_replaced_or_deleted_file(tmp_path):
    import os
    import shutil

    from prometheus_client import CollectorRegistry

    from flowscope.observability import StoreCollector

    path, other = tmp_path / "live.db", tmp_path / "backup.db"
    await paused_sessions(path, ids=("one",))
    await paused_sessions(other, ids=("two", "three"))
    store = SqliteEventStore(path, readonly=True)
    registry = CollectorRegistry()
    registry.register(StoreCollector(store))

    def waiting():
        return registry.get_sample_value(
            "flowscope_store_open_runs", {"workflow": "w", "node": "ask", "state": "waiting_input"}
        )

    assert (waiting(), registry.get_sample_value("flowscope_store_up")) == (1, 1)
    os.replace(shutil.copy(other, tmp_path / "restored.db"), path)  # a restore from backup
    assert (waiting(), registry.get_sample_value("flowscope_store_up")) == (2, 1)
    os.remove(path)
    assert registry.get_sample_value("flowscope_store_up") == 0


async def test_one_corrupt_payload_row_makes_stuck_skip_that_session_with_a_warning(tmp_path):

    path = tmp_path / "c.db"
    await paused_sessions(path)
    with sqlite3.connect(path) as conn:
        conn.execute("UPDATE events SET payload = '{bad' WHERE session_id = 'sess-a' AND seq = 2")
    result = CliRunnerMixed().invoke("--db", str(path), "stuck", "--older-than", "0s", "--format", "json")
    assert result.exit_code == 0, result.output
    assert {r["session_id"] for r in __import__("json").loads(result.stdout)} == {"sess-b"}
    assert "warning: skipped session 'sess-a'" in result.stderr and "seq 2" in result.stderr


class CliRunnerMixed:
    """click's CliRunner with stderr kept apart from stdout."""

    def invoke(self, *args):
        from click.testing import CliRunner

        from flowscope.cli import cli

        try:
            runner = CliRunner(mix_stderr=False)
        except TypeError:  # click >= 8.2 always keeps them apart
            runner = CliRunner()
        return runner.invoke(cli, list(args), catch_exceptions=False)


@pytest.mark.slow
def test_a_bit_flipped_session_id_gives_a_one_line_error(tmp_path):
    import asyncio
    import subprocess

    path = tmp_path / "b.db"
    asyncio.run(paused_sessions(path, ids=("sess-a",)))
    flipped = b"sess-" + bytes([ord("a") ^ 0x80])  # one bit: not UTF-8 any more
    for command in ("show", "export", "resume"):
        proc = subprocess.run(  # bytes: the argument is not UTF-8
            [FLOWSCOPE, "--db", str(path), command, flipped],
            capture_output=True,
            env=cli_env(),
            timeout=60,
        )
        err = proc.stderr.decode("utf-8", "replace").strip()
        assert proc.returncode == 2, (command, err)
        assert len(err.splitlines()) == 1 and err.startswith("flowscope: error:"), (command, err)
        assert "unexpected" not in err and "Traceback" not in err, (command, err)


# -- the CLI's own output ------------------------------------------------------------------------

HOSTILE_MODULE = """
from flowscope import START, Workflow, node


class StrRaises(Exception):
    def __str__(self):
        raise RuntimeError("__str__ is broken")


@node
async def ask(ctx, x):
    return await ctx.request_input("how to fail?")


@node
def boom(how):
    if how == "str":
        raise StrRaises()
    if how == "huge":
        raise RuntimeError("x" * 5_000_000)
    raise RuntimeError("/var/lib/corrupt/locked.db: database is locked, disk is full")


wf = Workflow("hostile", edges=[(START, ask, boom)])
"""


@pytest.mark.slow
@pytest.mark.parametrize("how", ["str", "huge", "path"])
def test_cli_resume_failure_is_exit_1_with_a_short_classified_line(tmp_path, how):
    import asyncio
    import importlib
    import sys

    (tmp_path / "hostile_wf.py").write_text(HOSTILE_MODULE)
    sys.path.insert(0, str(tmp_path))
    try:
        wf = importlib.import_module("hostile_wf").wf
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("hostile_wf", None)
    path = tmp_path / "cli.db"
    with SqliteEventStore(path) as store:
        asyncio.run(Runner(wf, store=store).run(None, session_id="s"))
    proc = run_cli(
        "--db",
        str(path),
        "resume",
        "s",
        "--input",
        f'ask@1="{how}"'.replace("ask@1", "hostile@1/ask@1"),
        "--workflow",
        "hostile_wf:wf",
        cwd=tmp_path,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out[-2000:]
    assert "this is a bug" not in out and "unexpected" not in out
    failed = [line for line in out.splitlines() if line.startswith("failed at")]
    assert len(failed) == 1 and failed[0].startswith("failed at hostile@1/boom@1: UNKNOWN_ERROR: "), out[
        -2000:
    ]
    assert all(len(line) <= 1200 for line in out.splitlines())
    assert len(out) < 10_000
    if how == "str":
        assert failed[0].endswith(": StrRaises")
    if how == "path":
        assert "/var/lib" not in out and "<path>" in failed[0]


async def test_keys_that_collide_in_json_are_refused_not_one_value_dropped(store):
    @node
    def two_ones(x):
        return {1: "int key", "1": "str key"}

    from flowscope.errors import OutputNotSerializableError

    with pytest.raises(OutputNotSerializableError, match="two keys become '1' in JSON"):
        await Runner(Workflow("dups", edges=[(START, two_ones)]), store=store).run(0, session_id="d")


def test_an_input_nested_too_deeply_for_json_is_a_one_line_cli_error(tmp_path):
    from click.testing import CliRunner

    from flowscope.cli import cli

    deep = "[" * 50_000 + "]" * 50_000
    db = tmp_path / "deep.db"
    for args in (["start", "wf", "--input", deep], ["resume", "s", "--input", f"q={deep}"]):
        result = CliRunner().invoke(cli, ["--db", str(db), *args])
        assert result.exit_code == 2, (args[0], result.output)
        assert "nested too deeply" in result.output and "bug" not in result.output
        assert len(result.output.strip().splitlines()) == 1
    assert not db.exists() or SqliteEventStore(db).sessions() == []  # nothing appended

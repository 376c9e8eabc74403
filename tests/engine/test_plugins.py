"""Plugin hooks: coverage of every node kind, order, sync and async hooks."""

from __future__ import annotations

import pytest

from flowscope import START, JoinNode, Plugin, Runner, Workflow, node
from flowscope.plugins import PluginDispatcher


class Recorder(Plugin):
    def __init__(self, name, log, use_async=False):
        self.name = name
        self.log = log
        self.use_async = use_async

    def _rec(self, *item):
        self.log.append((self.name, *item))

    def before_run(self, run):
        self._rec("before_run", run.workflow)

    def after_run(self, run, result, error):
        self._rec("after_run", result.status if result else type(error).__name__)

    def before_node(self, ctx):
        if self.use_async:

            async def hook():
                self._rec("before_node", ctx.path, ctx.kind)

            return hook()
        self._rec("before_node", ctx.path, ctx.kind)

    async def after_node(self, ctx, outcome):
        self._rec("after_node", ctx.path, outcome.status)

    def on_node_error(self, ctx, event):
        self._rec("on_node_error", event.path)


def build():
    child = node(lambda x: x, name="child")

    @node
    async def dyn(ctx, x):
        return await ctx.run_node(child, x)

    inner = Workflow("inner", edges=[(START, node(lambda x: x, name="leaf"))])
    a, b = node(lambda x: 1, name="a"), node(lambda x: 2, name="b")
    join = JoinNode("join")
    return Workflow("w", edges=[(START, (a, b)), ((a, b), join), (join, inner, dyn)])


async def test_every_node_kind_gets_before_and_after(store):
    log = []
    await Runner(build(), store=store, plugins=[Recorder("p", log)]).run(None, session_id="s")
    befores = {(p, k) for (_n, h, p, *rest) in log if h == "before_node" for k in rest}
    assert befores == {
        ("w@1", "workflow"),
        ("w@1/a@1", "function"),
        ("w@1/b@1", "function"),
        ("w@1/join@1", "join"),
        ("w@1/inner@1", "workflow"),
        ("w@1/inner@1/leaf@1", "function"),
        ("w@1/dyn@1", "function"),
        ("w@1/dyn@1/child@1", "function"),
    }
    afters = [p for (_n, h, p, *_r) in log if h == "after_node"]
    assert sorted(afters) == sorted(p for p, _k in befores)  # exactly once each
    assert log[0][1] == "before_run" and log[-1][1] == "after_run"


async def test_before_hooks_in_registration_order_after_hooks_reversed(store):
    log = []
    plugins = [Recorder("first", log), Recorder("second", log, use_async=True)]
    await Runner(build(), store=store, plugins=plugins).run(None, session_id="s")
    for path in ("w@1/inner@1/leaf@1", "w@1/dyn@1/child@1", "w@1/join@1"):
        around = [(n, h) for (n, h, p, *_r) in log if p == path]
        assert around == [
            ("first", "before_node"),
            ("second", "before_node"),
            ("second", "after_node"),
            ("first", "after_node"),
        ]
    assert [(n, h) for (n, h, *_r) in log if h.endswith("_run")] == [
        ("first", "before_run"),
        ("second", "before_run"),
        ("second", "after_run"),
        ("first", "after_run"),
    ]


async def test_nested_runs_are_bracketed_by_their_parent(store):
    log = []
    await Runner(build(), store=store, plugins=[Recorder("p", log)]).run(None, session_id="s")
    seq = [(h, p) for (_n, h, p, *_r) in log if h in ("before_node", "after_node")]
    for parent, child in (
        ("w@1/inner@1", "w@1/inner@1/leaf@1"),
        ("w@1/dyn@1", "w@1/dyn@1/child@1"),
        ("w@1", "w@1/a@1"),
    ):
        assert seq.index(("before_node", parent)) < seq.index(("before_node", child))
        assert seq.index(("after_node", child)) < seq.index(("after_node", parent))


async def test_on_node_error_and_failure_outcomes(store):
    log = []

    def bad(x):
        raise ValueError("x")

    inner = Workflow("inner", edges=[(START, node(bad, name="bad"))])
    with pytest.raises(ValueError):
        await Runner(Workflow("w", edges=[(START, inner)]), store=store, plugins=[Recorder("p", log)]).run(
            None, session_id="s"
        )
    assert [e for e in log if e[1] == "on_node_error"] == [("p", "on_node_error", "w@1/inner@1/bad@1")]
    outcomes = {p: st for (_n, h, p, *rest) in log if h == "after_node" for st in rest}
    assert outcomes == {"w@1/inner@1/bad@1": "failure", "w@1/inner@1": "failure", "w@1": "failure"}
    assert log[-1] == ("p", "after_run", "ValueError")


async def test_dispatcher_skips_hooks_a_plugin_does_not_override():
    class OnlyEvents(Plugin):
        def on_event(self, event):
            pass

    d = PluginDispatcher([OnlyEvents()])
    assert d.has_on_event and not d.has_node_hooks and not d.wants("before_run")
    assert not PluginDispatcher([]).has_on_event


async def test_events_reach_a_plugin_once_per_append_or_once_per_event(store):
    """on_events gets each append's events in one call; a plugin with only on_event gets
    them one by one; a failure in either is isolated and counted under its hook."""
    batches: list[list[str]] = []
    singles: list[str] = []

    class Batched(Plugin):
        name = "batched"

        def on_events(self, events):
            batches.append([e.type for e in events])
            raise RuntimeError("batch")

    class Single(Plugin):
        name = "single"

        def on_event(self, event):
            singles.append(event.type)
            raise RuntimeError("one")

    runner = Runner(
        Workflow("w", edges=[(START, node(lambda x: x, name="a"), node(lambda x: x, name="b"))]),
        store=store,
        plugins=[Batched(), Single()],
    )
    await runner.run(1, session_id="s")
    flat = [t for b in batches for t in b]
    assert flat == singles == [e.type for e in store.read("s")]
    assert len(batches) < len(flat)  # appends of several events came in one call
    assert runner.plugins.errors[("batched", "on_events")] == len(batches)
    assert runner.plugins.errors[("single", "on_event")] == len(singles)
    d = PluginDispatcher([Batched()])
    assert d.has_on_event and d.wants("on_event") and d.wants("on_events")


async def test_an_error_hook_that_raises_is_one_redacted_line_without_a_traceback(store, caplog):
    class Broken(Plugin):
        name = "broken"

        def before_run(self, run):
            raise RuntimeError("reading /home/alice/app.ini password=hunter2")

    class BadReporter(Plugin):
        name = "bad-reporter"

        def on_plugin_error(self, plugin, hook, error):
            raise ValueError(f"cannot report {error}")

    wf = Workflow("w", edges=[(START, node(lambda x: x + 1, name="a"))])
    assert (
        await Runner(wf, store=store, plugins=[Broken(), BadReporter()]).run(1, session_id="s")
    ).output == 2
    assert "plugin 'bad-reporter' raised in on_plugin_error: ValueError: cannot report" in caplog.text
    assert not any(r.exc_info for r in caplog.records)
    assert "hunter2" not in caplog.text and "alice" not in caplog.text

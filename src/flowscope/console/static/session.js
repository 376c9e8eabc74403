// A session: its summary and actions, what it waits on (forms that validate first), one
// waterfall across its invocations (a row per node path, a segment per invocation, the
// idle gaps between invocations compressed with their length written on them; only the
// rows in view are drawn, so 10,000 runs stay responsive), a run's attempts and events,
// and the session's event log with filters.
import { fill, api, badge, confirmAction, fmtDuration, fmtTime, h, icon, invocationLabel, shq, table } from "./dom.js";

const ROW = 22;
const C = { path: 0, name: 1, depth: 2, status: 3, kind: 4, attempts: 5, retries: 6, recoveries: 7, start: 8, duration: 9, segments: 10, children: 11, code: 12 };

export async function sessionPage(main, sid) {
  const readOnly = window.flowscope.info.read_only;
  const head = h("div", { class: "card", id: "summary" });
  const waiting = h("div", { class: "card waiting", id: "waiting", hidden: true });
  const wf = h("div", { class: "wf", id: "waterfall" });
  const detail = h("div", { class: "detail", id: "detail", hidden: true });
  const layout = h("div", { class: "layout nodetail" }, wf, detail);
  const log = h("div", { class: "card", id: "events" });
  fill(main, h("h2", {}, "Session ", h("code", {}, sid)), head, waiting, layout, log);

  let data = null;
  let selected = null;
  const collapsed = new Set();
  let view = null;

  async function load() {
    // the log drawn: its last seq, and its last append's time (a session pruned and run
    // again under its id may reach the same seq with another log)
    const at = data && data.session.updated_at !== null ? `&at=${data.session.updated_at}` : "";
    const since = data ? `?since=${data.last_seq}${at}` : "";
    let res;
    try {
      const early = !data && window.flowscopePrefetch;
      window.flowscopePrefetch = null;
      const got = early ? await early : await api(`/api/sessions/${encodeURIComponent(sid)}/waterfall${since}`);
      if (got instanceof Error) throw got;
      res = got.data;
    } catch (e) {
      fill(head, h("p", { class: "error" }, e.message));
      return;
    }
    if (res.unchanged) {
      // the log has not grown, but a worker may have died or a deadline passed since
      const was = stuckKey(data.stuck);
      data.stuck = res.stuck || [];
      if (stuckKey(data.stuck) !== was) { drawSummary(); drawWaiting(); }
      return;
    }
    data = res;
    drawSummary();
    drawWaiting();
    if (!view) view = waterfall(wf, () => data, collapsed, (path) => select(path));
    view.redraw();
    if (selected) select(selected, true);
  }

  function drawSummary() {
    const s = data.session || {};
    const orphaned = (data.stuck || []).some((r) => r.state === "orphaned");
    const cell = (k, v) => h("div", {}, h("span", { class: "k" }, k), v);
    const actions = h("div", { class: "actions" });
    // a bridge's session: its engine continues it; flowscope's actions would be refused
    const bridged = s.engine ? h("p", { class: "engine-note", id: "engine" }, `Run by ${s.engine}, whose bridge records it: flowscope does not answer, retry or cancel it. ${s.continued_in}.`) : null;
    if (!readOnly && !bridged) {
      const fromSel = selected ? selected : null;
      if (data.status === "failed" || data.status === "completed") {
        if (data.status === "failed") actions.append(actionButton("retry", "Retry", `Retry session ${sid}?`, "It runs again from where it failed, on a worker of its workflow; finished runs are kept.", {}));
        actions.append(actionButton("retry", fromSel ? `Retry from ${fromSel.split("/").pop()}` : "Retry from a node…", `Retry session ${sid} from ${fromSel}?`,
          "The run at this path and what follows it run again as new attempts; runs before it are kept.", { from_path: fromSel }, !fromSel, "retry-from"));
      }
      if (!["completed", "failed", "cancelled"].includes(data.status)) {
        actions.append(actionButton("cancel", "Cancel", `Cancel session ${sid}?`, "Its open runs are cancelled (never failed) and it ends cancelled, for good. A live worker stops it within one lease renewal.", {}));
      }
    }
    fill(head, 
      h("div", { class: "summary" },
        cell("Status", h("span", { id: "status" }, badge(data.status))),
        cell("Workflow", data.workflow),
        cell("Invocations", String(data.invocations)),
        cell("Node runs", String(data.rows.length)),
        cell("Started (UTC)", fmtTime(s.started_at)),
        cell("Updated (UTC)", fmtTime(s.updated_at)),
        cell("Error code", s.error_code ?? "-"),
        cell("Owner", s.owner ? `${s.owner.worker_id} (${s.owner.host}, pid ${s.owner.pid})` + (orphaned ? ": gone" : "") : "-")),
      stuckLines(data.stuck || [], !!s.engine),
      bridged || actions,
      h("p", { class: "notice", id: "notice" }));
  }

  // The command acting on this session, as the server writes it (rowparts.session_command):
  // an id that starts with "-" after "--", so that pasted it is no option.
  function sessionCommand(verb, options) {
    const prefix = window.flowscope.info.prefix;
    return sid.startsWith("-") ? `${prefix} ${verb}${options} -- ${shq(sid)}` : `${prefix} ${verb} ${shq(sid)}${options}`;
  }

  function actionButton(kind, label, title, text, extra, disabled = false, id = null) {
    const b = h("button", { type: "button", class: kind === "cancel" ? "danger" : "", id: id || `action-${kind}`, disabled }, icon(kind), label);
    b.addEventListener("click", async () => {
      const done = await confirmAction({
        title, text,
        command: (reason) => sessionCommand(kind, (extra.from_path ? ` --from ${shq(extra.from_path)}` : "") + (reason ? ` --reason ${shq(reason)}` : "")),
        act: (reason) => api(`/api/sessions/${encodeURIComponent(sid)}/${kind}`, { ...extra, reason }),
      });
      if (done) {
        await load();
        const n = document.getElementById("notice");
        if (n) n.textContent = done.data.pending ? `${kind} sent: its live owner (${done.data.owner}) takes it in` : `${kind} recorded`;
      }
    });
    return b;
  }

  // Redrawn when the requests change, not at every new event: a form kept for the same
  // request keeps what the operator is typing, and the focus (a branch still running
  // appends events every second).
  function drawWaiting() {
    const items = data.waiting || [];
    waiting.hidden = !items.length;
    const keyOf = (w) => `${w.kind}:${w.kind === "input" ? w.interrupt_id : w.job_id}`;
    const shown = [...waiting.querySelectorAll(".form")];
    if (!items.length) { fill(waiting); return; }
    if (shown.map((el) => el.dataset.key).join("\n") !== items.map(keyOf).join("\n")) {
      const kept = new Map(shown.map((el) => [el.dataset.key, el]));
      fill(waiting, h("h3", {}, "Waiting on"), ...items.map((w) => kept.get(keyOf(w)) || waitingForm(w, keyOf(w))));
    }
    // a kept form keeps its text; whether its job is overdue is `stuck`'s word of now
    for (const note of waiting.querySelectorAll(".overdue-note")) {
      const row = (data.stuck || []).find((r) => r.state === "overdue" && r.waiting_on.includes(note.dataset.job));
      note.hidden = !row;
      const how = (data.session || {}).engine ? `; ${row && row.action}` : "; to report its result: ";
      fill(note, row ? [badge("overdue"), ` past its deadline (${fmtTime(row.job_deadline_at, true)})${how}`, (data.session || {}).engine ? null : h("code", { class: "cmd" }, row.action)] : []);
    }
  }

  function waitingForm(w, key) {
    const box = h("div", { class: "form", dataset: { waiting: w.kind === "input" ? w.interrupt_id : w.job_id, key } });
    const err = h("div", { class: "error" });
    const what = w.kind === "input"
      ? h("div", {}, h("b", {}, w.prompt || w.interrupt_id), h("div", { class: "muted" }, `input ${w.interrupt_id} at ${w.path}`),
          w.problem ? h("div", {}, "Problem: ", w.problem) : null, w.fix ? h("div", {}, "Fix: ", w.fix) : null)
      : h("div", {}, h("b", {}, `job ${w.job_id}`), h("div", { class: "muted" }, `at ${w.path}; a result has ${w.keys.join(", ")}` + (w.expect_count ? " (count > 0 expected)" : "")
          + (w.deadline_s !== null && w.deadline_s !== undefined ? `; deadline ${fmtDuration(w.deadline_s)} after dispatch` : "")),
        h("div", { class: "overdue-note", dataset: { job: w.job_id }, hidden: true }));
    box.append(what);
    if (readOnly || (data.session || {}).engine) return box;
    // ``raw``: the value's JSON text as sent, not parsed and encoded again, which would
    // round an integer past 2**53 (the server parses it exactly, as the CLI does)
    const send = async (raw) => {
      const id = JSON.stringify(w.kind === "input" ? w.interrupt_id : w.job_id);
      const body = (dry) => `{"${w.kind === "input" ? "inputs" : "jobs"}": {${id}: ${raw}}${dry ? ', "dry_run": true' : ""}}`;
      try {
        const check = await api(`/api/sessions/${encodeURIComponent(sid)}/answer`, body(true));
        const done = await confirmAction({
          title: `Answer ${w.kind === "input" ? w.interrupt_id : w.job_id}?`, text: `Records ${raw} for session ${sid}; a worker of ${data.workflow} then resumes it.`,
          danger: false, askReason: false, command: () => check.data.command, act: () => api(`/api/sessions/${encodeURIComponent(sid)}/answer`, body(false)),
        });
        if (done) { await load(); const n = document.getElementById("notice"); if (n) n.textContent = "answered" + (done.data.pending ? " (its live owner takes it in)" : ""); }
      } catch (e) { err.textContent = e.message; }
    };
    if (w.actions && w.actions.length) {
      box.append(...w.actions.map((a) => h("button", { type: "button", dataset: { answer: a }, on: { click: () => send(JSON.stringify(a)) } }, a)));
    } else {
      const text = h("textarea", { name: "value", placeholder: "a JSON value: true, \"yes\", {\"k\": 1}" });
      text.value = w.kind === "input" ? "true" : JSON.stringify(w.expect_count ? { success: true, count: 1, data: {} } : { success: true, data: {} });
      const go = h("button", { type: "button", class: "primary", dataset: { submit: "1" } }, icon("answer"), "Answer…");
      go.addEventListener("click", () => {
        err.textContent = "";
        try { JSON.parse(text.value); } catch (e) { err.textContent = "not JSON: " + e.message; return; }
        send(text.value.trim());
      });
      box.append(text, go);
    }
    box.append(err);
    return box;
  }

  async function select(path, again = false) {
    selected = path;
    if (!again) drawSummary();
    if (view) view.mark(path);
    layout.classList.remove("nodetail");
    detail.hidden = false;
    let d;
    try { d = (await api(`/api/sessions/${encodeURIComponent(sid)}/run?path=${encodeURIComponent(path)}`)).data; } catch (e) { fill(detail, h("p", { class: "error" }, e.message)); return; }
    const r = d.row;
    const events = h("div", { id: "run-events" });
    fill(detail, 
      h("h3", {}, h("code", {}, r.path)),
      h("div", {}, badge(r.status), ` ${r.kind}, ${r.attempts} attempt(s), ${r.retries} retr${r.retries === 1 ? "y" : "ies"}, ${r.recoveries} recover${r.recoveries === 1 ? "y" : "ies"}`),
      r.error_code ? h("p", {}, h("b", {}, r.error_code), ` ${r.error_type || ""}: ${r.error_message || ""}`) : null,
      h("h3", {}, "Attempts ", h("span", { class: "muted" }, "(click one for its events alone)")),
      table([
        ["#", (a) => a.attempt], ["Invocation", (a) => invocationLabel(a.invocation_id), "id"],
        ["Worker", (a) => (a.owner ? `${a.owner.worker_id} on ${a.owner.host}` : "-"), "worker"],
        ["Started (UTC)", (a) => fmtTime(a.started_at)], ["Took", (a) => fmtDuration(a.duration_s)],
        ["Outcome", (a) => a.outcome + (a.recovered ? " (recovered)" : "")],
        ["Error", (a) => (a.error_code ? `${a.error_type} [${a.error_code}] ${a.error_message || ""}` : "-"), "wrap"],
      ], d.attempts, "No attempt started.", (a, tr) => {
        const again = tr.classList.contains("sel");
        for (const other of tr.parentNode.children) other.classList.remove("sel");
        if (!again) tr.classList.add("sel");
        showEvents(again ? null : a);
      }),
      h("p", { class: "muted" }, r.owner ? `Session owner: ${r.owner.worker_id} on ${r.owner.host}, pid ${r.owner.pid}` : "No owner recorded."),
      h("h3", {}, "Events"),
      events,
    );
    // one attempt's events: those of its invocation from its start to its end
    function showEvents(a) {
      const rows = a ? d.events.filter((e) => e.invocation_id === a.invocation_id && e.ts >= a.started_at - 1e-6 && (a.ended_at === null || e.ts <= a.ended_at + 1e-6)) : d.events;
      fill(events, a ? h("p", { class: "muted", id: "attempt-filter" }, `attempt ${a.attempt}: ${rows.length} of ${d.events.length} event(s)`) : null,
        table([["Seq", (e) => e.seq], ["Type", (e) => e.type], ["Fields", (e) => h("div", { class: "ev-fields" }, fieldsText(e.fields)), "wrap"]], rows));
    }
    showEvents(null);
  }

  function drawLog() {
    const type = h("input", { type: "text", size: 16, name: "ev-type", placeholder: "node_error,node_retrying" });
    const path = h("input", { type: "text", size: 24, name: "ev-path", placeholder: "a path (and below)" });
    const fails = h("input", { type: "checkbox", name: "ev-failures" });
    const out = h("div");
    const go = async () => {
      const q = new URLSearchParams();
      if (type.value.trim()) q.set("types", type.value.trim());
      if (path.value.trim()) q.set("path", path.value.trim());
      if (fails.checked) q.set("failures", "1");
      try {
        const rows = (await api(`/api/sessions/${encodeURIComponent(sid)}/events?${q}`)).data;
        fill(out, h("p", { class: "muted" }, `${rows.length} event(s)`), table([
          ["Seq", (e) => e.seq], ["Time (UTC)", (e) => fmtTime(e.ts)], ["Type", (e) => e.type], ["Inv.", (e) => invocationLabel(e.invocation_id), "id"],
          ["Path", (e) => e.path || "-", "id"], ["Fields", (e) => h("div", { class: "ev-fields" }, fieldsText(e.fields)), "wrap"],
        ], rows.slice(0, 500)), rows.length > 500 ? h("p", { class: "muted" }, "first 500 shown: narrow by type or path") : null);
      } catch (e) { fill(out, h("p", { class: "error" }, e.message)); }
    };
    fill(log, h("h3", {}, "Event log"), h("div", { class: "filters" },
      h("label", {}, "Types ", type), " ", h("label", {}, "Path ", path), " ", h("label", {}, fails, " failures only"), " ",
      h("button", { type: "button", on: { click: go } }, "Show")), out);
  }

  await load();
  drawLog();
  return () => load();
}

// What `flowscope stuck` says of the session that its status hides (orphaned, overdue),
// each with the command stuck suggests.
function stuckLines(rows, bridged) {
  if (!rows.length) return null;
  // a bridge's session: the action is what its engine does, not a command to paste
  if (bridged) return h("div", { class: "stuck-state", id: "stuck" }, rows.map((r) => h("div", { dataset: { state: r.state } }, badge(r.state), ` at ${r.path}: ${r.action}`)));
  return h("div", { class: "stuck-state", id: "stuck" }, rows.map((r) => h("div", { dataset: { state: r.state } },
    badge(r.state), ` at ${r.path}: `,
    r.state === "orphaned"
      ? (r.owner ? `its owner ${r.owner.worker_id} (${r.owner.host}, pid ${r.owner.pid}) is gone`
        : r.heartbeat_age_s !== null ? `its last heartbeat was ${fmtDuration(r.heartbeat_age_s)} ago` : "it never beat a heartbeat") + "; take it over: "
      : `job ${r.waiting_on.join(", ")} is past its deadline (${fmtTime(r.job_deadline_at, true)}); report its result: `,
    h("code", { class: "cmd" }, r.action))));
}

function stuckKey(rows) {
  return (rows || []).map((r) => `${r.state} ${r.path} ${r.action}`).join("\n");
}

function fieldsText(fields) {
  return Object.entries(fields || {}).map(([k, v]) => `${k}=${typeof v === "string" ? v : JSON.stringify(v)}`).join("  ");
}

// The waterfall, virtualised: the visible rows (collapsed subtrees left out) are computed
// once per change; only those in the scrolled window are in the DOM.
function waterfall(root, getData, collapsed, onSelect) {
  const axisHead = h("div", { class: "wf-axis" });
  const header = h("div", { class: "wf-head" }, h("div", {}, "Node"), h("div", {}, "Status"), h("div", {}, "Att."), h("div", {}, "Took"), axisHead);
  const spacer = h("div", { class: "wf-spacer" });
  const scroll = h("div", { class: "wf-scroll" }, spacer);
  const note = h("div", { class: "wf-note" });
  fill(root, header, scroll, note);
  let visible = [];
  let selected = null;
  let drawn = [-1, -1];

  function computeVisible() {
    const rows = getData().rows;
    visible = [];
    let hideBelow = null;
    for (let i = 0; i < rows.length; i++) {
      const r = rows[i];
      if (hideBelow !== null) {
        if (r[C.depth] > hideBelow) continue;
        hideBelow = null;
      }
      visible.push(i);
      if (r[C.children] && collapsed.has(r[C.path])) hideBelow = r[C.depth];
    }
    spacer.style.height = `${visible.length * ROW}px`;
    scroll.style.height = `${Math.min(560, Math.max(visible.length, 1) * ROW + 4)}px`;  // no empty band under a short session
  }

  function pct(x) { return `${(x / getData().axis.width) * 100}%`; }

  function drawAxis() {
    const ax = getData().axis;
    fill(axisHead, ...ax.gaps.map((g) => h("div", { class: "gap", dataset: { gap: g.duration_s }, title: `idle ${fmtDuration(g.duration_s)} between invocations` })));
    [...axisHead.children].forEach((el, i) => { el.style.left = pct(ax.gaps[i].x); el.style.width = pct(ax.gaps[i].width); });
    ax.gaps.forEach((g) => {
      const label = h("span", { class: "gap-label" }, fmtDuration(g.duration_s));
      label.style.left = pct(g.x + g.width / 2);
      axisHead.append(label);
    });
    const rows = getData().rows;
    note.textContent = `${rows.length} node run(s), ${visible.length} shown` + (ax.gaps.length ? `; ${ax.gaps.length} idle gap(s) between invocations drawn compressed` : "") + "; click a row for its attempts and events";
  }

  function rowEl(i, top) {
    const d = getData();
    const r = d.rows[i];
    const name = h("div", { class: "wf-name", title: r[C.path] });
    name.style.paddingLeft = `${4 + r[C.depth] * 14}px`;
    if (r[C.children]) {
      const t = h("button", { type: "button", class: "wf-toggle" + (collapsed.has(r[C.path]) ? " shut" : ""), title: "collapse or expand", "aria-label": "toggle" }, icon("chevron"));
      t.addEventListener("click", (ev) => {
        ev.stopPropagation();
        if (collapsed.has(r[C.path])) collapsed.delete(r[C.path]); else collapsed.add(r[C.path]);
        redraw();
      });
      name.append(t);
    } else name.append(h("span", { class: "wf-pad" }));
    name.append(h("span", {}, r[C.name]));
    if (r[C.retries]) name.append(h("span", { class: "muted" }, ` retried ${r[C.retries]}x`));
    if (r[C.recoveries]) name.append(h("span", { class: "muted" }, ` recovered ${r[C.recoveries]}x`));
    const bars = h("div", { class: "wf-bars" });
    for (const g of d.axis.gaps) { const el = h("div", { class: "gap" }); el.style.left = pct(g.x); el.style.width = pct(g.width); bars.append(el); }
    const segs = r[C.segments];
    segs.forEach(([a, b], k) => {
      const last = k === segs.length - 1;
      const el = h("div", { class: `seg ${last ? r[C.status] : "completed"}${last && r[C.recoveries] ? " recovered" : ""}` });
      el.style.left = pct(a);
      el.style.width = pct(Math.max(b - a, 0));
      bars.append(el);
      if (last && r[C.retries]) { const m = h("div", { class: "mark", title: `${r[C.retries]} retried attempt(s)` }); m.style.left = pct(a); bars.append(m); }
    });
    const el = h("div", { class: "wf-row" + (selected === r[C.path] ? " sel" : ""), dataset: { path: r[C.path], status: r[C.status] }, tabindex: "0", role: "button" },
      name, h("div", {}, badge(r[C.status])), h("div", {}, String(r[C.attempts])), h("div", {}, fmtDuration(r[C.duration])), bars);
    el.style.top = `${top}px`;
    el.addEventListener("click", () => onSelect(r[C.path]));
    el.addEventListener("keydown", (ev) => { if (ev.key === "Enter" || ev.key === " ") { ev.preventDefault(); onSelect(r[C.path]); } });
    return el;
  }

  function drawWindow(force = false) {
    const first = Math.max(0, Math.floor(scroll.scrollTop / ROW) - 10);
    const last = Math.min(visible.length, Math.ceil((scroll.scrollTop + scroll.clientHeight) / ROW) + 10);
    if (!force && first === drawn[0] && last === drawn[1]) return;
    drawn = [first, last];
    const els = [];
    for (let k = first; k < last; k++) els.push(rowEl(visible[k], k * ROW));
    fill(spacer, ...els);
  }

  function redraw() {
    computeVisible();
    drawAxis();
    drawWindow(true);
  }

  scroll.addEventListener("scroll", () => requestAnimationFrame(() => drawWindow()), { passive: true });
  return {
    redraw,
    mark(path) { selected = path; drawWindow(true); },
  };
}

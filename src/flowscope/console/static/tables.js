// The stuck and audit pages: the rows of `flowscope stuck` and `flowscope audit`, each
// stuck row with its fix (the exact command, and the page that acts on it).
import { fill, api, badge, fmtDuration, fmtTime, h, table } from "./dom.js";

export async function stuckPage(main) {
  const out = h("div", { id: "stuck" });
  fill(main, h("h2", {}, "Stuck and waiting runs"), h("p", { class: "muted" }, "Open runs, innermost first, as `flowscope stuck --older-than 0s` lists them."), out);
  async function refresh() {
    try {
      const rows = (await api("/api/stuck")).data;
      fill(out, table([
        ["Session", (r) => h("a", { href: "/sessions/" + encodeURIComponent(r.session_id) }, r.session_id), "id"],
        ["Workflow", (r) => r.workflow], ["Path", (r) => r.path, "id"], ["State", (r) => badge(r.state)],
        ["Attempt", (r) => r.attempt], ["Age", (r) => fmtDuration(r.age_s)], ["Waiting on", (r) => r.waiting_on.join(", ") || "-"],
        ["Fix", (r) => fix(r), "wrap"],
      ], rows, "Nothing is stuck or waiting."));
    } catch (e) { fill(out, h("p", { class: "error" }, e.message)); }
  }
  await refresh();
  return refresh;
}

// A command to paste is code, with the page that acts on it; anything else (a bridge's
// session, which its engine continues; a live run to look at) is said as text.
function fix(r) {
  if (!r.action.startsWith(`${window.flowscope.info.prefix} `)) return h("div", {}, r.action);
  const answers = r.state === "waiting_input" || r.state === "waiting_job" || r.state === "overdue";
  return h("div", {}, h("code", { class: "cmd" }, r.action),
    answers ? h("a", { href: "/sessions/" + encodeURIComponent(r.session_id) }, "answer on its page") : null);
}

export async function auditPage(main) {
  const out = h("div", { id: "audit" });
  fill(main, h("h2", {}, "Audit"), h("p", { class: "muted" }, "Attempts, retries, recoveries and errors per workflow and node (`flowscope audit`)."), out);
  async function refresh() {
    try {
      const rows = (await api("/api/audit")).data;
      const kv = (o) => Object.entries(o || {}).map(([k, v]) => `${k}: ${v}`).join(", ") || "-";
      fill(out, table([
        ["Workflow", (r) => r.workflow], ["Node", (r) => r.node + (r.root ? " (root)" : "")], ["Kind", (r) => r.kind],
        ["Runs", (r) => r.runs], ["Completed", (r) => r.completed], ["Failed", (r) => r.failed], ["Errors", (r) => r.errors],
        ["Open", (r) => r.open], ["Attempts", (r) => r.attempts], ["Retries", (r) => r.retries], ["Recoveries", (r) => r.recoveries],
        ["Error codes", (r) => kv(r.error_codes), "wrap"], ["Retried for", (r) => kv(r.retry_errors), "wrap"],
      ], rows));
    } catch (e) { fill(out, h("p", { class: "error" }, e.message)); }
  }
  await refresh();
  return refresh;
}

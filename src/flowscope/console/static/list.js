// The sessions page: attention tabs with counts, filters kept in the URL (the server
// filters and pages; newest first), the rows of `flowscope runs`, and bulk actions on a
// filter (the count first, then a confirmation).
import { fill, api, badge, confirmAction, fmtDuration, fmtTime, h, icon, shq, table } from "./dom.js";

const FILTERS = [
  ["status", "Status"], ["workflow", "Workflow"], ["since", "Updated since"], ["until", "Updated until"],
  ["error_code", "Error code"], ["owner", "Owner"], ["q", "Session id contains"],
];

function linkWith(params, changes) {
  const p = new URLSearchParams(params);
  for (const [k, v] of Object.entries(changes)) { if (v === null || v === "") p.delete(k); else p.set(k, v); }
  const s = p.toString();
  return "/" + (s ? "?" + s : "");
}

export async function sessionsPage(main) {
  const info = window.flowscope.info;
  const params = new URLSearchParams(location.search);
  const tabs = h("div", { class: "tabs", id: "tabs" });
  const form = h("form", { class: "filters", method: "get", action: "/", id: "filters" });
  for (const [name, label] of FILTERS) {
    let input;
    if (name === "status") {
      input = h("select", { name }, h("option", { value: "" }, "any"), info.statuses.map((s) => h("option", { value: s }, s)));
      input.value = params.get(name) || "";
    } else {
      input = h("input", { type: "text", name, size: name === "q" ? 18 : 12, placeholder: name === "since" || name === "until" ? "1h, 2026-12-01 (UTC)" : "" });
      input.value = params.get(name) || "";
    }
    form.append(h("label", {}, label, input));
  }
  if (params.get("attention")) form.append(h("input", { type: "hidden", name: "attention", value: params.get("attention") }));
  form.append(h("button", { type: "submit", class: "primary" }, "Filter"), h("a", { href: "/" }, "clear"));
  const list = h("div", { id: "list" });
  const pager = h("div", { class: "pager" });
  const bulk = bulkPanel(params);
  fill(main, h("h2", {}, "Sessions"), tabs, form, list, pager, bulk);

  async function refresh() {
    const q = new URLSearchParams(params);
    if (!q.get("limit")) q.set("limit", "50");
    let res;
    try {
      res = await api("/api/sessions?" + q.toString());
    } catch (e) {
      fill(list, h("p", { class: "error" }, e.message));
      return;
    }
    const rows = res.data;
    const total = Number(res.headers.get("x-total-count"));
    const counts = JSON.parse(res.headers.get("x-attention") || "{}");
    const here = params.get("attention");
    fill(tabs, 
      h("a", { href: linkWith(params, { attention: null, offset: null }), class: here ? "" : "here" }, "All"),
      ...Object.entries(info.attention).map(([key, label]) => h("a", {
        href: linkWith(params, { attention: key, offset: null }), class: here === key ? "here" : "", dataset: { tab: key },
      }, label, h("span", { class: "n" + (counts[key] ? " hot" : "") }, String(counts[key] ?? 0)))),
    );
    fill(list, table([
      ["Session", (r) => h("a", { href: "/sessions/" + encodeURIComponent(r.session_id) }, r.session_id), "id"],
      ["Workflow", (r) => r.workflow],
      ["Status", (r) => badge(r.status)],
      ["Updated (UTC)", (r) => fmtTime(r.updated_at)],
      ["Duration", (r) => fmtDuration(r.duration_s)],
      ["Inv.", (r) => r.invocations],
      ["Runs", (r) => r.node_runs],
      ["Open", (r) => r.open_runs],
      ["Failed", (r) => r.failed_runs],
      ["Error code", (r) => r.error_code],
      ["Owner", (r) => (r.owner ? `${r.owner.worker_id} (${r.owner.host}, pid ${r.owner.pid})` : "-")],
    ], rows, "No session matches."));
    const offset = Number(params.get("offset") || 0);
    const limit = Number(params.get("limit") || 50);
    if (total && !rows.length) {  // an offset past the end (an old link, sessions pruned): say so, link the last page
      fill(pager,
        h("span", { class: "muted", id: "count" }, `No session on this page (${total} in all)`),
        h("a", { href: linkWith(params, { offset: Math.floor((total - 1) / limit) * limit || null }) }, "last page"),
      );
      return;
    }
    fill(pager, 
      h("span", { class: "muted", id: "count" }, total ? `${offset + 1}-${offset + rows.length} of ${total}` : "0 sessions"),
      offset > 0 ? h("a", { href: linkWith(params, { offset: Math.max(0, offset - limit) || null }) }, "newer") : null,
      offset + rows.length < total ? h("a", { href: linkWith(params, { offset: offset + limit }) }, "older") : null,
    );
  }
  await refresh();
  return refresh;
}

function bulkPanel(params) {
  if (window.flowscope.info.read_only) return h("div");
  const info = window.flowscope.info;
  const action = h("select", { name: "action" }, h("option", { value: "retry" }, "retry"), h("option", { value: "cancel" }, "cancel"));
  const workflow = h("input", { type: "text", size: 14, name: "bulk-workflow" });
  workflow.value = params.get("workflow") || "";
  const state = h("select", { name: "bulk-state" }, h("option", { value: "" }, "any"), info.bulk_states.map((s) => h("option", { value: s }, s)));
  state.value = params.get("status") || "";
  const older = h("input", { type: "text", size: 8, name: "bulk-older", placeholder: "10m" });
  const out = h("div", { class: "muted", id: "bulk-out" });
  const go = h("button", { type: "button", id: "bulk-go" }, "Select…");
  go.addEventListener("click", async () => {
    const filters = { action: action.value, workflow: workflow.value.trim(), state: state.value, older_than: older.value.trim() };
    out.textContent = "";
    let found;
    try { found = (await api("/api/bulk", filters)).data; } catch (e) { out.textContent = e.message; return; }
    if (!found.count) { out.textContent = "No session matches these filters."; return; }
    const done = await confirmAction({
      title: `${filters.action} ${found.count} session(s)?`,
      text: `${found.count} session(s) match: ${found.session_ids.slice(0, 8).join(", ")}${found.count > 8 ? ", …" : ""}`,
      command: (reason) => found.command + (reason ? ` --reason ${shq(reason)}` : ""),
      act: (reason) => api("/api/bulk", { ...filters, confirm: found.session_ids, reason }),
    });
    if (done) {
      const ok = done.data.results.filter((r) => r.ok).length;
      out.textContent = `${filters.action}: ${ok} of ${done.data.count} done` + (ok < done.data.count ? `; refused: ${done.data.results.filter((r) => !r.ok).map((r) => `${r.session_id} (${r.error})`).join("; ")}` : "");
    }
  });
  return h("div", { class: "card" }, h("h3", {}, icon("retry"), " Bulk action"),
    h("div", { class: "filters" }, h("label", {}, "Action ", action), " ", h("label", {}, "Workflow ", workflow), " ",
      h("label", {}, "State ", state), " ", h("label", {}, "Last updated before ", older), " ", go), out);
}

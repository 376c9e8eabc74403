// Small helpers shared by the pages: elements built with textContent only (never HTML from
// data), SVG icons, the API (the token travels in a same-site cookie), and formatting.

const SVG = "http://www.w3.org/2000/svg";

// replaceChildren, leaving out null, undefined and false (conditional parts)
export function fill(el, ...kids) {
  el.replaceChildren(...kids.flat().filter((k) => k !== null && k !== undefined && k !== false));
}

export function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k === "class") el.className = v;
    else if (k === "on") for (const [ev, fn] of Object.entries(v)) el.addEventListener(ev, fn);
    else if (k === "dataset") Object.assign(el.dataset, v);
    else if (k in el && typeof v !== "string") el[k] = v;
    else el.setAttribute(k, v === true ? "" : String(v));
  }
  for (const c of children.flat()) {
    if (c === null || c === undefined || c === false) continue;
    el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return el;
}

const PATHS = {
  retry: "M13 8a5 5 0 1 1-1.5-3.5M13 2v3h-3",
  cancel: "M4 4l8 8M12 4l-8 8",
  chevron: "M3 6l5 5 5-5",
  answer: "M3 8l3 3 7-7",
  live: "M2 8h3l2-5 2 10 2-5h3",
  pause: "M5 3v10M11 3v10",
};

export function icon(name) {
  const svg = document.createElementNS(SVG, "svg");
  svg.setAttribute("viewBox", "0 0 16 16");
  svg.setAttribute("class", "icon");
  svg.setAttribute("aria-hidden", "true");
  const p = document.createElementNS(SVG, "path");
  p.setAttribute("d", PATHS[name]);
  p.setAttribute("fill", "none");
  p.setAttribute("stroke", "currentColor");
  p.setAttribute("stroke-width", "2");
  p.setAttribute("stroke-linecap", "round");
  p.setAttribute("stroke-linejoin", "round");
  svg.append(p);
  return svg;
}

export class ApiError extends Error {
  constructor(status, message) { super(message); this.status = status; }
}

export async function api(path, body) {
  const init = body === undefined ? {} : {
    // a string is JSON text already (an answer as typed: see session.js)
    method: "POST", headers: { "content-type": "application/json" }, body: typeof body === "string" ? body : JSON.stringify(body),
  };
  const r = await fetch(path, { credentials: "same-origin", ...init });
  let data = null;
  try { data = await r.json(); } catch (e) { data = null; }
  // 503: the store cannot be used (its file deleted or replaced, a server down): said once,
  // above every page, until a read of the store answers again (/api/info reads none)
  if (r.status === 503) storeBanner((data && data.error) || "the store cannot be used (HTTP 503)");
  else if (r.ok && !path.startsWith("/api/info")) storeBanner(null);
  if (!r.ok) throw new ApiError(r.status, (data && data.error) || `HTTP ${r.status}`);
  return { data, headers: r.headers };
}

function storeBanner(text) {
  const el = document.getElementById("banner");
  if (!el) return;
  el.hidden = !text;
  el.textContent = text || "";
}

export function badge(status) {
  return h("span", { class: `badge s-${status}` }, status ?? "-");
}

// Times are UTC, as the CLI prints them and as the filters read a typed date: a column
// says so in its header ("Updated (UTC)"), a time in a sentence with ``zone``.
// An invocation's label: its last 8 hex digits, the whole id in its title. Its ids are
// UUIDv7 (time first), so two invocations within about a minute share their first 8.
export function invocationLabel(id) {
  return h("span", { title: id }, id.slice(-8));
}

export function fmtTime(ts, zone = false) {
  if (ts === null || ts === undefined) return "-";
  const d = new Date(ts * 1000);
  const p = (n) => String(n).padStart(2, "0");
  const text = `${d.getUTCFullYear()}-${p(d.getUTCMonth() + 1)}-${p(d.getUTCDate())} ${p(d.getUTCHours())}:${p(d.getUTCMinutes())}:${p(d.getUTCSeconds())}`;
  return zone ? `${text} UTC` : text;
}

export function fmtDuration(s) {
  if (s === null || s === undefined) return "-";
  if (s < 0) s = 0;
  if (s < 1) return `${Math.round(s * 1000)}ms`;
  if (s < 60) return `${s.toFixed(2)}s`;
  if (s < 3600) return `${Math.floor(s / 60)}m${String(Math.floor(s % 60)).padStart(2, "0")}s`;
  if (s < 86400) return `${Math.floor(s / 3600)}h${String(Math.floor((s % 3600) / 60)).padStart(2, "0")}m`;
  return `${Math.floor(s / 86400)}d${String(Math.floor((s % 86400) / 3600)).padStart(2, "0")}h`;
}

export function table(columns, rows, empty = "(nothing)", onRow = null) {
  if (!rows.length) return h("p", { class: "muted" }, empty);
  return h("table", { class: "rows" + (onRow ? " clickable" : "") },
    h("thead", {}, h("tr", {}, columns.map(([title]) => h("th", {}, title)))),
    h("tbody", {}, rows.map((r) => h("tr", onRow ? { tabindex: "0", on: { click: (ev) => onRow(r, ev.currentTarget), keydown: (ev) => { if (ev.key === "Enter" || ev.key === " ") { ev.preventDefault(); onRow(r, ev.currentTarget); } } } } : {}, columns.map(([, cell, cls]) => {
      const v = cell(r);
      return h("td", { class: cls || null }, v instanceof Node ? v : (v ?? "-"));
    })))));
}

// A confirmation with a reason and the equivalent command; resolves to the reason, or null.
export function confirmAction({ title, text, command, danger = true, act, askReason = true }) {
  const dlg = document.getElementById("confirm");
  document.getElementById("confirm-title").textContent = title;
  document.getElementById("confirm-text").textContent = text;
  const cmd = document.getElementById("confirm-cmd");
  const reason = document.getElementById("confirm-reason");
  const err = document.getElementById("confirm-error");
  const yes = document.getElementById("confirm-yes");
  reason.value = "";
  reason.closest("label").hidden = !askReason;  // answers take no reason: the value is the record
  err.textContent = "";
  yes.className = danger ? "danger" : "primary";
  const showCmd = () => { cmd.textContent = command(reason.value.trim()); };
  reason.oninput = showCmd;
  showCmd();
  return new Promise((resolve) => {
    const onClick = async (ev) => {
      ev.preventDefault();
      yes.disabled = true;
      try {
        const result = await act(reason.value.trim());
        dlg.close();
        resolve(result);
      } catch (e) {
        err.textContent = e.message;
      } finally {
        yes.disabled = false;
      }
    };
    yes.onclick = onClick;
    document.getElementById("confirm-no").onclick = (ev) => { ev.preventDefault(); dlg.close(); resolve(null); };
    dlg.oncancel = () => resolve(null);  // Escape
    dlg.showModal();
  });
}

export function shq(s) {
  return /^[A-Za-z0-9_@%+=:,./-]+$/.test(s) ? s : `'${s.replace(/'/g, "'\"'\"'")}'`;
}

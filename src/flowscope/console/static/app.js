// The console's entry module: which page the path names, the header, and live updates.
// Live: one EventSource per page on /api/live; the server probes the store at most once a
// second for every page together and sends "change" when it moved; the page then reloads
// its own data. The switch in the header pauses it (remembered in this browser).
import { api } from "./dom.js";
import { sessionsPage } from "./list.js";
import { sessionPage } from "./session.js";
import { stuckPage, auditPage } from "./tables.js";

const main = document.getElementById("main");

function route() {
  const p = location.pathname;
  if (p.startsWith("/sessions/")) return ["sessions", () => sessionPage(main, decodeURIComponent(p.slice("/sessions/".length)))];
  if (p === "/stuck") return ["stuck", () => stuckPage(main)];
  if (p === "/audit") return ["audit", () => auditPage(main)];
  return ["sessions", () => sessionsPage(main)];
}

// A session page's data is asked for at once, beside /api/info, not after it.
function prefetch() {
  const p = location.pathname;
  if (!p.startsWith("/sessions/")) return null;
  return api(`/api/sessions/${encodeURIComponent(decodeURIComponent(p.slice("/sessions/".length)))}/waterfall`).catch((e) => e);
}

function startLive(refresh) {
  const box = document.getElementById("live");
  const state = document.getElementById("live-state");
  let source = null;
  const open = () => {
    source = new EventSource("/api/live");
    source.addEventListener("change", () => refresh());
    source.onerror = () => { state.textContent = "reconnecting"; };
    source.onopen = () => { state.textContent = "live"; };
  };
  const close = () => { if (source) source.close(); source = null; state.textContent = "paused"; };
  box.checked = localStorage.getItem("flowscope.live") !== "off";
  box.addEventListener("change", () => {
    localStorage.setItem("flowscope.live", box.checked ? "on" : "off");
    if (box.checked) { open(); refresh(); } else close();
  });
  if (box.checked) open(); else close();
  window.addEventListener("pagehide", () => { if (source) source.close(); });
}

async function boot() {
  const [nav, draw] = route();
  window.flowscopePrefetch = prefetch();
  for (const a of document.querySelectorAll("header nav a")) a.classList.toggle("here", a.dataset.nav === nav);
  try {
    const { data } = await api("/api/info");
    document.getElementById("db").textContent = data.db + (data.read_only ? " (read-only)" : "");
    window.flowscope = { info: data };
    if (data.read_only) document.body.classList.add("read-only");
  } catch (e) {
    main.replaceChildren();
    const p = document.createElement("p");
    p.className = "error";
    p.textContent = e.status === 403 ? "This page needs the console's token: open the URL `flowscope ui` printed (…/?token=…)." : e.message;
    main.append(p);
    return;
  }
  const refresh = await draw();
  document.body.dataset.ready = "1";
  performance.mark("flowscope-ready");  // navigation to drawn: what the tests and bench/ measure
  if (typeof refresh === "function") startLive(refresh);
}

boot();

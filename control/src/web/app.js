// xvs web view: the admin API's own JSON, drawn. No library, no build
// step: the daemon serves this file as it is. Over the TCP listener the
// API wants the admin token: given once in the URL fragment
// (/ui#token=...), never sent in a URL, kept for this tab only.
"use strict";

const state = { token: sessionStorage.getItem("xvs-token") || "", drops: [], lastDrops: null };

(function takeToken() {
  const m = location.hash.match(/token=([^&]+)/);
  if (m) {
    state.token = decodeURIComponent(m[1]);
    sessionStorage.setItem("xvs-token", state.token);
    history.replaceState(null, "", location.pathname);
  }
})();

document.getElementById("login").addEventListener("submit", (ev) => {
  ev.preventDefault();
  state.token = document.getElementById("token").value.trim();
  sessionStorage.setItem("xvs-token", state.token);
  document.getElementById("login").hidden = true;
  tick();
});

async function api(path) {
  const headers = state.token ? { Authorization: "Bearer " + state.token } : {};
  const res = await fetch(path, { headers, cache: "no-store" });
  if (res.status === 401) {
    document.getElementById("login").hidden = false;
    throw new Error("the admin API wants its token");
  }
  if (!res.ok) throw new Error(path + ": " + res.status);
  return res;
}

function el(tag, text, cls) {
  const e = document.createElement(tag);
  if (text !== undefined && text !== null) e.textContent = String(text);
  if (cls) e.className = cls;
  return e;
}

function row(cells, cls) {
  const tr = el("tr", null, cls);
  for (const c of cells) {
    if (c instanceof Node) {
      const td = el("td");
      td.appendChild(c);
      tr.appendChild(td);
    } else if (typeof c === "number") {
      tr.appendChild(el("td", fmt(c), "num"));
    } else {
      tr.appendChild(el("td", c));
    }
  }
  return tr;
}

function fmt(n) {
  if (n >= 1e9) return (n / 1e9).toFixed(2) + "G";
  if (n >= 1e6) return (n / 1e6).toFixed(2) + "M";
  if (n >= 1e4) return (n / 1e3).toFixed(1) + "k";
  return Number.isInteger(n) ? String(n) : n.toFixed(1);
}

function duration(s) {
  s = Math.floor(s);
  const d = Math.floor(s / 86400), h = Math.floor(s / 3600) % 24, m = Math.floor(s / 60) % 60;
  if (d) return d + "d" + h + "h";
  if (h) return h + "h" + m + "m";
  if (m) return m + "m" + (s % 60) + "s";
  return s + "s";
}

function hostPort(addr, port) {
  return (addr.includes(":") ? "[" + addr + "]" : addr) + ":" + port;
}

function replace(tbody, rows) {
  tbody.replaceChildren(...rows);
}

async function overview() {
  const o = await (await api("/v1/overview")).json();
  document.getElementById("summary").textContent =
    "xvs " + o.version + " · up " + duration(o.uptime_seconds) + " · " +
    fmt(o.flows) + " flows · " + o.services.services + " services";
  const s = o.services;
  const kube = o.kubernetes
    ? (o.kubernetes.synced ? "synced" : "NOT synced") + ", " + o.kubernetes.errors + " watch errors"
    : "off";
  const rows = [
    ["interfaces", o.interfaces.map((i) => i.name + " (" + i.role + "): XDP " + i.xdp_mode).join(", ")],
    ["flows", fmt(o.flows) + " / " + fmt(o.capacity) + " (" + (100 * o.flows / Math.max(o.capacity, 1)).toFixed(1) + "%)"],
    ["SNAT", o.snat.addresses.join(", ") + " ports " + o.snat.ports + "; last minute " +
      o.snat.exhausted_last_minute + " exhausted, " + o.snat.reclaimed_last_minute + " reclaimed"],
    ["services", s.services + " (" + s.from_kubernetes + " from Kubernetes), " + s.backends + " backends: " +
      s.healthy + " healthy, " + s.down + " down, " + s.quiesced + " quiesced"],
    ["Kubernetes", kube],
    ["restart", o.restart.hold_ms ? "hold " + o.restart.hold_ms + " ms, adopted " + o.restart.adopted_flows + " flows" : "survival off"],
    ["drops (" + Math.round(o.window_seconds) + "s)", o.drops_last_minute.map((d) => d[0] + " " + d[1]).join(", ") || "none"],
  ];
  replace(document.querySelector("#status tbody"), rows.map((r) => row(r)));
  replace(document.querySelector("#workers tbody"), o.workers.map((w) =>
    row([String(w.worker), String(w.queue), String(w.core), (w.zero_copy ? "zero-copy" : "copy") + (w.huge_pages ? ", 2 MiB pages" : ", 4 KiB pages"),
      fmt(w.rx_pps) + " pps", fmt(w.tx_pps) + " pps", (100 * w.busy).toFixed(0) + "%", w.flows])));
  recordDrops(o.drops_total);
}

const COLORS = ["#cf222e", "#bf8700", "#8250df", "#0969da", "#1a7f37", "#e16f24", "#57606a", "#d63384"];

function recordDrops(totals) {
  const now = Date.now() / 1000;
  const cur = Object.fromEntries(totals);
  if (state.lastDrops) {
    const dt = now - state.lastDrops.t;
    const rates = {};
    for (const [reason, n] of totals) {
      const d = n - (state.lastDrops.v[reason] || 0);
      if (d > 0) rates[reason] = d / dt;
    }
    state.drops.push({ t: now, rates });
    while (state.drops.length && now - state.drops[0].t > 600) state.drops.shift();
  }
  state.lastDrops = { t: now, v: cur };
  drawDrops();
}

function drawDrops() {
  const svg = document.getElementById("drops");
  const legend = document.getElementById("drops-legend");
  const reasons = [...new Set(state.drops.flatMap((p) => Object.keys(p.rates)))].sort();
  const max = Math.max(1, ...state.drops.flatMap((p) => Object.values(p.rates)));
  const ns = "http://www.w3.org/2000/svg";
  const nodes = [];
  if (state.drops.length > 1) {
    const t0 = state.drops[0].t, span = Math.max(1, state.drops[state.drops.length - 1].t - t0);
    reasons.forEach((r, k) => {
      const pts = state.drops.map((p) =>
        ((p.t - t0) / span * 600).toFixed(1) + "," + (158 - (p.rates[r] || 0) / max * 150).toFixed(1));
      const line = document.createElementNS(ns, "polyline");
      line.setAttribute("points", pts.join(" "));
      line.setAttribute("fill", "none");
      line.setAttribute("stroke", COLORS[k % COLORS.length]);
      line.setAttribute("stroke-width", "2");
      line.setAttribute("vector-effect", "non-scaling-stroke");
      nodes.push(line);
    });
  }
  svg.replaceChildren(...nodes);
  legend.replaceChildren(...(reasons.length ? reasons.map((r, k) => {
    const s = el("span", r);
    const i = el("i");
    i.style.background = COLORS[k % COLORS.length];
    s.prepend(i);
    return s;
  }) : [el("span", "no drops since this page opened (max " + fmt(max) + "/s)")]));
}

async function services() {
  const l = await (await api("/v1/services")).json();
  const rows = [];
  const select = document.getElementById("service");
  const chosen = select.value;
  const keys = [""];
  for (const s of l.services) {
    const key = hostPort(s.vip, s.port);
    keys.push(key);
    rows.push(row([s.protocol.toUpperCase() + " " + key, s.scheduler, "", "", "", "", "", s.stats.conns,
      s.rates.cps, s.rates.inpps, s.rates.outpps, s.rates.inbps, s.rates.outbps], "service"));
    for (const b of s.backends) {
      const health = el("span", b.health || "unchecked", b.health === "down" ? "health-down" : "");
      rows.push(row(["", "", hostPort(b.address, b.port) + " (" + b.forward + ")", b.weight, health,
        b.active, b.inactive, b.stats.conns, b.rates.cps, b.rates.inpps, b.rates.outpps, b.rates.inbps, b.rates.outbps]));
    }
  }
  replace(document.querySelector("#services tbody"), rows);
  const have = [...select.options].map((o) => o.value);
  if (have.join("|") !== keys.join("|")) {
    select.replaceChildren(...keys.map((k) => {
      const o = el("option", k || "all");
      o.value = k;
      return o;
    }));
    select.value = keys.includes(chosen) ? chosen : "";
  }
}

async function flows() {
  if (document.getElementById("pause").checked) return;
  const q = new URLSearchParams({ last: "200" });
  const verdict = document.getElementById("verdict").value;
  const service = document.getElementById("service").value;
  if (verdict) q.set("verdict", verdict);
  if (service) q.set("service", service);
  const text = await (await api("/v1/events?" + q)).text();
  const events = text.split("\n").filter((l) => l).map((l) => JSON.parse(l)).reverse();
  replace(document.querySelector("#flows tbody"), events.map((e) =>
    row([new Date(e.time_ms).toLocaleTimeString(), el("span", e.verdict, "verdict-" + e.verdict),
      e.reason || "", e.protocol, e.src, e.dst, e.backend || "", e.snat || "", String(e.worker)])));
}

async function tick() {
  const err = document.getElementById("error");
  try {
    await Promise.all([overview(), services(), flows()]);
    err.hidden = true;
  } catch (e) {
    err.textContent = String(e.message || e);
    err.hidden = false;
  }
}

document.getElementById("verdict").addEventListener("change", flows);
document.getElementById("service").addEventListener("change", flows);
tick();
setInterval(tick, 2000);

// fak console: chat, engine, decisions, policy tester. Plain JS, no dependencies, nothing fetched
// but this server's own routes. The API key (fak serve --api-key) is asked once and kept in
// sessionStorage, then sent as a Bearer token.
"use strict";

const $ = (sel) => document.querySelector(sel);
const el = (tag, attrs = {}, ...kids) => {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (k === "class") e.className = v; else if (k === "text") e.textContent = v; else e.setAttribute(k, v);
  }
  for (const k of kids) e.append(k);
  return e;
};
const KEY = "fak.apiKey";
let model = null;

// ---------------------------------------------------------------- API + key
let keyWaiters = [];
function askKey(message) {
  $("#keyform").hidden = false;
  $("#key-error").textContent = message || "";
  $("#key").focus();
  return new Promise((resolve) => keyWaiters.push(resolve));
}
$("#keyform").addEventListener("submit", (ev) => {
  ev.preventDefault();
  sessionStorage.setItem(KEY, $("#key").value.trim());
  $("#keyform").hidden = true;
  const w = keyWaiters; keyWaiters = [];
  w.forEach((r) => r());
});

async function api(path, opts = {}) {
  for (;;) {
    const headers = Object.assign({}, opts.headers || {});
    const key = sessionStorage.getItem(KEY);
    if (key) headers.Authorization = "Bearer " + key;
    if (opts.json !== undefined) { headers["Content-Type"] = "application/json"; opts.body = JSON.stringify(opts.json); }
    const r = await fetch(path, Object.assign({}, opts, { headers }));
    if (r.status !== 401) return r;
    await askKey(key ? "that key was refused" : "");
  }
}
async function errorText(r) {
  try { const j = await r.json(); return (j.error && j.error.message) || JSON.stringify(j); }
  catch (e) { return r.status + " " + r.statusText; }
}

// ---------------------------------------------------------------- tabs
const views = ["chat", "engine", "decisions", "policy"];
function show() {
  const tab = views.includes(location.hash.slice(1)) ? location.hash.slice(1) : "chat";
  for (const v of views) $("#view-" + v).hidden = v !== tab;
  document.querySelectorAll("#tabs a").forEach((a) => a.classList.toggle("active", a.dataset.tab === tab));
  if (tab === "decisions") refreshDecisions();
  if (tab === "engine" && samples.length) { charts.forEach(draw); tiles(samples[samples.length - 1]); }
}
window.addEventListener("hashchange", show);

// ---------------------------------------------------------------- status
async function health() {
  try {
    const r = await fetch("/health");
    const j = await r.json();
    const ok = r.status === 200;
    $("#status-dot").className = "dot " + (ok ? "ok" : j.status === "error" ? "bad" : "wait");
    $("#status-text").textContent = ok ? j.model : j.reason || j.status;
    if (ok && !model) {
      const m = await (await fetch("/v1/models")).json();
      model = (m.data && m.data[0] && m.data[0].id) || j.model;
    }
    return ok;
  } catch (e) {
    $("#status-dot").className = "dot bad";
    $("#status-text").textContent = "server unreachable";
    return false;
  }
}

// ---------------------------------------------------------------- chat
let history = [];
let aborter = null;

function verdictCard(a) {
  const refused = !a.emitted;
  const card = el("div", { class: "call " + (refused ? "refused" : "allowed") });
  card.append(el("span", { class: "badge " + a.verdict, text: a.verdict }), el("b", { text: " " + a.tool + " " }),
    el("span", { class: "reason", text: a.reason + (a.detail ? ": " + a.detail : "") }),
    el("span", { class: "by", text: " by " + a.by }));
  if (refused) card.append(el("div", { class: "sub", text: "refused by the kernel: not sent to the client" }));
  return card;
}

function toolsValue() {
  const text = $("#tools").value.trim();
  if (!text) return null;
  let tools;
  try { tools = JSON.parse(text); } catch (e) { throw new Error("tools: not valid JSON (" + e.message + ")"); }
  if (!Array.isArray(tools)) tools = [tools];
  return tools.map((t, i) => {
    if (t && t.type === "function" && t.function) return t;
    if (t && typeof t.name === "string") return { type: "function", function: t };  // a bare {name, parameters}
    throw new Error("tools[" + i + "]: expected {type: 'function', function: {name, parameters}}");
  });
}

async function send(text) {
  $("#chat-error").textContent = "";
  let tools;
  try { tools = toolsValue(); } catch (e) { $("#chat-error").textContent = e.message; return; }
  const msgs = [];
  if ($("#system").value.trim()) msgs.push({ role: "system", content: $("#system").value });
  msgs.push(...history, { role: "user", content: text });
  const body = { messages: msgs, stream: true, stream_options: { include_usage: true },
    temperature: Number($("#temperature").value), max_tokens: Number($("#max-tokens").value) };
  if (model) body.model = model;
  if (tools) { body.tools = tools; body.tool_choice = $("#tool-choice").value; }
  const box = $("#messages");
  box.append(el("div", { class: "msg user", text: text }));
  const out = el("div", { class: "msg assistant streaming" });
  const textEl = el("div", { class: "text" });
  const meta = el("div", { class: "meta" });
  out.append(textEl, meta);
  box.append(out);
  box.scrollTop = box.scrollHeight;
  $("#send").disabled = true; $("#stop").disabled = false;
  aborter = new AbortController();
  let reply = "", calls = [], usage = null, failed = false;
  try {
    const r = await api("/v1/chat/completions", { method: "POST", json: body, signal: aborter.signal });
    if (!r.ok) throw new Error(await errorText(r));
    const reader = r.body.getReader();
    const dec = new TextDecoder();
    let buf = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buf += dec.decode(value, { stream: true });
      let cut;
      while ((cut = buf.indexOf("\n\n")) >= 0) {
        const ev = buf.slice(0, cut); buf = buf.slice(cut + 2);
        if (!ev.startsWith("data: ")) continue;
        const data = ev.slice(6);
        if (data === "[DONE]") continue;
        const j = JSON.parse(data);
        if (j.error) throw new Error(j.error.message);
        if (j.usage) usage = j.usage;
        for (const c of j.choices || []) {
          const d = c.delta || {};
          if (d.content) { reply += d.content; textEl.textContent = reply; box.scrollTop = box.scrollHeight; }
          for (const tc of d.tool_calls || []) {
            if (tc.id) calls[tc.index] = { name: tc.function.name, arguments: "" };
            else if (calls[tc.index]) calls[tc.index].arguments += tc.function.arguments || "";
          }
          if (j.fak) for (const a of j.fak.adjudications || []) out.insertBefore(verdictCard(a), meta);
        }
      }
    }
  } catch (e) {
    if (e.name !== "AbortError") { $("#chat-error").textContent = e.message; failed = true; }
  } finally {
    out.classList.remove("streaming");
    $("#send").disabled = false; $("#stop").disabled = true; aborter = null;
  }
  for (const c of calls.filter(Boolean)) {
    out.insertBefore(el("pre", { class: "tool-call", text: c.name + " " + c.arguments }), meta);
  }
  if (usage) meta.textContent = usage.completion_tokens + " tokens";
  if (failed && !reply) { out.classList.add("failed"); textEl.textContent = "(no reply)"; return; }  // not in the history
  history.push({ role: "user", content: text }, { role: "assistant", content: reply });
}

$("#chat-form").addEventListener("submit", (ev) => {
  ev.preventDefault();
  const text = $("#prompt").value;
  if (!text.trim() || $("#send").disabled) return;
  $("#prompt").value = "";
  send(text);
});
$("#prompt").addEventListener("keydown", (ev) => {
  if (ev.key === "Enter" && !ev.shiftKey) { ev.preventDefault(); $("#chat-form").requestSubmit(); }
});
$("#stop").addEventListener("click", () => aborter && aborter.abort());
$("#clear").addEventListener("click", () => { history = []; $("#messages").textContent = ""; });

// ---------------------------------------------------------------- engine charts
const SPAN = 120;  // samples kept: two minutes at one a second
const COLORS = ["#2563eb", "#d97706", "#dc2626", "#059669", "#7c3aed"];
const charts = [
  { id: "tps", title: "tokens / s", series: [["tok/s", (s) => s.sched && s.sched.tokens_per_s]] },
  { id: "lanes", title: "lanes", series: [["running", (s) => s.sched && s.sched.running],
    ["waiting", (s) => s.sched && s.sched.waiting], ["preempted", (s) => s.sched && s.sched.preempted]] },
  { id: "kv", title: "KV blocks", series: [["used", (s) => s.kv && s.kv.used], ["budget", (s) => s.kv && s.kv.budget]] },
  { id: "prefix", title: "prefix hit rate", max: 1, series: [["hit rate", (s) => s.prefix_hit_rate]] },
  { id: "spec", title: "speculative: drafts kept", max: 1, series: [["kept", (s) => s.spec && s.spec.acceptance]] },
  { id: "preempt", title: "preemptions", series: [["swap", (s) => s.sched && s.sched.preemptions_swap],
    ["recompute", (s) => s.sched && s.sched.preemptions_recompute]] },
  { id: "ttft", title: "TTFT ms", series: [["p50", (s) => ms(s.ttft_s.p50)], ["p90", (s) => ms(s.ttft_s.p90)],
    ["p99", (s) => ms(s.ttft_s.p99)]] },
  { id: "itl", title: "ITL ms", series: [["p50", (s) => ms(s.itl_s.p50)], ["p90", (s) => ms(s.itl_s.p90)],
    ["p99", (s) => ms(s.itl_s.p99)]] },
];
const ms = (x) => (x == null ? null : 1000 * x);
const samples = [];

function setupCharts() {
  const box = $("#charts");
  for (const c of charts) {
    c.canvas = el("canvas", { id: "chart-" + c.id });
    c.caption = el("figcaption", { text: c.title });
    c.legend = el("div", { class: "legend" });
    box.append(el("figure", { class: "chart", "data-chart": c.id }, c.caption, c.canvas, c.legend));
  }
}

const fmt = (v) => (v == null ? "–" : Math.abs(v) >= 100 || Number.isInteger(v) ? String(Math.round(v)) : v.toFixed(2));
function niceCeil(v) {  // 1, 2 or 5 times a power of ten, at or above v
  const p = Math.pow(10, Math.floor(Math.log10(v)));
  for (const m of [1, 2, 5, 10]) if (m * p >= v) return m * p;
  return 10 * p;
}

function draw(c) {
  const dpr = window.devicePixelRatio || 1, cw = c.canvas.clientWidth || 360, ch = c.canvas.clientHeight || 140;
  if (c.canvas.width !== Math.round(cw * dpr)) { c.canvas.width = Math.round(cw * dpr); c.canvas.height = Math.round(ch * dpr); }
  const ctx = c.canvas.getContext("2d"), W = cw, H = ch, pad = 16, left = 34;
  ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
  ctx.clearRect(0, 0, W, H);
  const values = c.series.map(([, f]) => samples.map((s) => { try { return f(s); } catch (e) { return null; } }));
  let hi = 0;
  for (const vs of values) for (const v of vs) if (v != null && v > hi) hi = v;
  hi = c.max || (hi > 0 ? niceCeil(hi) : 1);
  ctx.strokeStyle = "#e5e7eb"; ctx.fillStyle = "#6b7280"; ctx.font = "10px sans-serif"; ctx.lineWidth = 1;
  ctx.textAlign = "right"; ctx.textBaseline = "middle";
  for (const f of [0, 0.5, 1]) {
    const y = H - pad - f * (H - 2 * pad);
    ctx.beginPath(); ctx.moveTo(left, y); ctx.lineTo(W - 4, y); ctx.stroke();
    ctx.fillText(fmt(hi * f), left - 4, y);
  }
  const x = (i) => left + (i + SPAN - samples.length) * (W - left - 4) / (SPAN - 1);
  values.forEach((vs, k) => {
    ctx.strokeStyle = COLORS[k]; ctx.lineWidth = 1.6; ctx.lineJoin = "round"; ctx.beginPath();
    let on = false;
    vs.forEach((v, i) => {
      if (v == null) { on = false; return; }
      const y = H - pad - (Math.min(v, hi) / hi) * (H - 2 * pad);
      if (on) ctx.lineTo(x(i), y); else ctx.moveTo(x(i), y);
      on = true;
    });
    ctx.stroke();
  });
  c.legend.textContent = "";
  c.series.forEach(([name], k) => {
    const last = values[k][values[k].length - 1];
    const item = el("span", { "data-series": name, "data-value": last == null ? "" : String(last), text: name + " " + fmt(last) });
    item.style.color = COLORS[k];  // CSSOM, not a style attribute: the page's CSP allows no inline style
    c.legend.append(item);
  });
  c.canvas.dataset.samples = String(samples.length);
}

function tiles(s) {
  const t = $("#tiles"); t.textContent = "";
  const sc = s.sched || {}, k = s.kernel || {}, kv = s.kv || {};
  const kvChart = charts.find((c) => c.id === "kv");
  kvChart.caption.textContent = kv.growable ? "KV blocks (no budget: the pool grows)" : "KV blocks used / budget";
  const items = [["tokens generated", sc.tokens_generated], ["prefill tokens", sc.prefill_tokens],
    ["decode steps", sc.steps], ["requests", s.requests], ["5xx", s.errors_5xx],
    ["max running seen", sc.max_running_observed == null ? null : sc.max_running_observed + (sc.max_running ? " / " + sc.max_running : "")],
    [kv.growable ? "KV pool (grows)" : "KV budget", kv.budget == null ? null : kv.budget + " × " + sc.block_tokens + " tok"],
    ["preemption", sc.preempt_mode],
    ["tool calls judged", k.submits], ["denied", k.denies]];
  for (const [name, v] of items) t.append(el("div", { class: "tile" }, el("span", { text: name }), el("b", { text: v == null ? "–" : String(v) })));
  const w = $("#workers"); w.textContent = "";
  if (s.workers && s.workers.length) {
    const keys = ["name", "role", "up", "address"];  // then every other plain figure the rows carry
    for (const r of s.workers) for (const [key, v] of Object.entries(r)) {
      if (!keys.includes(key) && (v === null || typeof v !== "object" || Array.isArray(v)) && keys.length < 14) keys.push(key);
    }
    const cell = (v) => (v == null ? "–" : Array.isArray(v) ? v.join(":") : typeof v === "number" && !Number.isInteger(v) ? v.toFixed(3) : String(v));
    const tb = el("tbody");
    for (const r of s.workers) tb.append(el("tr", { class: r.up === false ? "refused" : "" },
      ...keys.map((key) => el("td", { text: cell(r[key]) }))));
    w.append(el("h3", { text: "workers" }), el("table", { id: "workers-table" },
      el("thead", {}, el("tr", {}, ...keys.map((key) => el("th", { text: key })))), tb));
  }
}

let polling = false;
async function pollStats() {
  if (polling) return;
  polling = true;
  try {
    const r = await api("/v1/fak/stats");
    if (r.ok) {
      const s = await r.json();
      samples.push(s);
      if (samples.length > SPAN) samples.shift();
      if (!$("#view-engine").hidden) { charts.forEach(draw); tiles(s); }
    }
  } catch (e) { /* the next tick tries again */ } finally { polling = false; }
}

// ---------------------------------------------------------------- decisions
let fetchingDecisions = false;
async function refreshDecisions() {
  if (fetchingDecisions) return;
  fetchingDecisions = true;
  try { await fillDecisions(); } finally { fetchingDecisions = false; }
}
async function fillDecisions() {
  const q = new URLSearchParams({ limit: "200" });
  if ($("#f-verdict").value) q.set("verdict", $("#f-verdict").value);
  if ($("#f-tool").value.trim()) q.set("tool", $("#f-tool").value.trim());
  const r = await api("/v1/fak/decisions?" + q);
  if (!r.ok) { $("#journal-line").textContent = await errorText(r); return; }
  const j = await r.json();
  const text = $("#f-text").value.trim().toLowerCase();
  const rows = j.decisions.filter((d) => !text || [d.reason, d.detail, d.by, d.tool].join(" ").toLowerCase().includes(text));
  $("#journal-line").textContent = (j.journal ? "journal: " + j.journal : "no journal file (fak serve --journal FILE keeps one)") +
    " · " + j.seen + " decisions since start · showing " + rows.length;
  const tb = $("#decisions tbody"); tb.textContent = "";
  for (const d of rows) {
    tb.append(el("tr", { class: d.verdict === "ALLOW" ? "" : "refused" },
      el("td", { text: String(d.id) }), el("td", { text: new Date(d.time * 1000).toLocaleTimeString() }),
      el("td", { text: d.tool }), el("td", {}, el("span", { class: "badge " + d.verdict, text: d.verdict })),
      el("td", { text: d.reason + (d.detail ? ": " + d.detail : "") }), el("td", { text: d.by }),
      el("td", { text: d.phase })));
  }
}
for (const id of ["#f-verdict", "#f-tool", "#f-text"]) $(id).addEventListener("input", refreshDecisions);
$("#verify").addEventListener("click", async () => {
  const out = $("#verify-result");
  out.className = ""; out.textContent = "verifying…";
  const r = await api("/v1/fak/audit/verify", { method: "POST" });
  if (!r.ok) { out.className = "warn"; out.textContent = await errorText(r); return; }
  const j = await r.json();
  out.className = j.ok ? "good" : "err";
  out.textContent = (j.ok ? "chain OK: " : "chain BROKEN: ") + j.summary;
});

// ---------------------------------------------------------------- policy tester
document.querySelectorAll(".presets button").forEach((b) => b.addEventListener("click", () => {
  $("#p-tool").value = b.dataset.tool; $("#p-args").value = b.dataset.args; $("#policy-form").requestSubmit();
}));
$("#policy-form").addEventListener("submit", async (ev) => {
  ev.preventDefault();
  const out = $("#p-result"); out.textContent = "";
  let args;
  try { args = JSON.parse($("#p-args").value); } catch (e) {
    out.append(el("p", { class: "err", text: "arguments: not valid JSON (" + e.message + ")" })); return;
  }
  const r = await api("/v1/fak/adjudicate", { method: "POST", json: { tool: $("#p-tool").value.trim(), arguments: args } });
  if (!r.ok) { out.append(el("p", { class: "err", text: await errorText(r) })); return; }
  const j = await r.json();
  const v = j.verdict;
  out.append(el("div", { class: "verdict " + (j.allowed ? "allowed" : "refused"), id: "p-verdict" },
    el("span", { class: "badge big " + v.kind, text: v.kind }),
    el("span", { class: "reason", text: " " + v.reason + (v.detail ? ": " + v.detail : "") }),
    el("div", { class: "sub", text: "by " + v.by + " · " + j.tool + " " + JSON.stringify(j.arguments) })));
});

// ---------------------------------------------------------------- start
setupCharts();
show();
(async function start() {
  while (!(await health())) await new Promise((r) => setTimeout(r, 1000));
  setInterval(health, 5000);
  setInterval(pollStats, 1000);
  setInterval(() => { if (!$("#view-decisions").hidden) refreshDecisions(); }, 2000);
  pollStats();
})();

"use strict";
// kvgate admin page: polls GET /admin/ui/state and drains / undrains workers through /admin/workers.
// No dependencies. The admin key (when the gateway has --admin-keys) is kept in sessionStorage and sent
// as "Authorization: Bearer <key>", like any client of the admin API.

const POLL_MS = 1500;
const KEY_ITEM = "kvgate-admin-key";
const CONFIRM_MS = 4000;

const ui = {
  polls: 0,
  state: null,
  seen: new Map(), // worker id -> {url, role, draining} as last listed
  gone: new Map(), // worker id -> {url, role}: drained, then removed once idle (can be registered again)
  armed: new Map(), // worker id -> time until which a first click on "drain" waits for the second
  timer: 0,
};

function $(id) { return document.getElementById(id); }

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs || {})) {
    if (value === null || value === undefined || value === false) continue;
    if (name === "class") node.className = value;
    else if (name === "title") node.title = value;
    else node.setAttribute(name, value === true ? "" : String(value));
  }
  for (const child of children) {
    if (child === null || child === undefined) continue;
    node.append(child instanceof Node ? child : String(child));
  }
  return node;
}

function key() { return sessionStorage.getItem(KEY_ITEM) || ""; }

async function api(method, path, body) {
  const headers = { accept: "application/json" };
  if (key()) headers.authorization = "Bearer " + key();
  if (body !== undefined) headers["content-type"] = "application/json";
  const resp = await fetch(path, {
    method, headers, body: body === undefined ? undefined : JSON.stringify(body), cache: "no-store",
  });
  let data = null;
  try { data = await resp.json(); } catch (_) { data = null; }
  if (resp.status === 401) askForKey(key() ? "that key was not accepted" : "");
  if (!resp.ok) {
    const why = data && data.error ? data.error.message : resp.statusText;
    throw new Error(`${method} ${path}: ${resp.status} ${why}`);
  }
  return data;
}

function askForKey(note) {
  $("keybar").hidden = false;
  $("keynote").textContent = note;
}

function say(text, cls) {
  const m = $("message");
  m.textContent = text;
  m.className = cls || "";
}

// ---- formatting ----------------------------------------------------------------------------------------

function pct(x) { return x === null || x === undefined ? "–" : Math.round(x * 100) + "%"; }
function num(x) { return x === null || x === undefined ? "–" : Number(x).toLocaleString("en-US"); }
function rate(x) { return !x ? "0" : x >= 100 ? x.toFixed(0) : x >= 10 ? x.toFixed(1) : x.toFixed(2); }
function ms(seconds) {
  if (seconds === null || seconds === undefined) return "–";
  const m = seconds * 1000;
  return m >= 10000 ? (m / 1000).toFixed(1) + " s" : m >= 100 ? m.toFixed(0) + " ms" : m.toFixed(1) + " ms";
}
function age(s) { return s < 60 ? s.toFixed(1) + " s" : Math.floor(s / 60) + " min"; }

function tag(text, cls, title) { return el("span", { class: cls, title }, text); }

// ---- the gateway line ----------------------------------------------------------------------------------

function gatewayLine(g, workers) {
  const healthy = workers.filter((w) => w.healthy && !w.draining).length;
  const parts = [
    el("span", {}, "v" + g.version),
    el("span", {}, "policy ", el("b", {}, g.policy)),
  ];
  if (g.state === "redis") {
    const sync = g.redis_degraded
      ? tag("DEGRADED: Redis unreachable, routing on local figures", "bad")
      : tag("synced", "ok");
    parts.push(el("span", { "data-fact": "sync" }, "state redis, ", sync,
      ` · replica ${g.replica_rank + 1} of ${g.replicas}`));
  } else {
    parts.push(el("span", { "data-fact": "sync" }, "state memory (this replica alone)"));
  }
  let index = "off";
  if (g.kv_index !== "off") {
    const modes = new Map();
    for (const w of workers) modes.set(w.index.mode, (modes.get(w.index.mode) || 0) + 1);
    const split = [...modes].map(([mode, n]) => `${n} ${mode}`).join(", ");
    index = `${g.kv_index} (${split || "no worker"}), ${num(g.index_blocks)} blocks of ${g.block_size} ${g.block_unit}`;
  }
  parts.push(el("span", { "data-fact": "index" }, "KV index ", el("b", {}, index)));
  if (g.drift === null) {
    parts.push(el("span", { "data-fact": "drift" }, "predictions: ", tag("not checked yet", "muted")));
  } else {
    const verdict = g.drift ? tag("DRIFT", "bad", "predicted hits are not materialising: check the "
      + "tokenizer, chat template and --block-size against the workers'") : tag("ok", "ok");
    parts.push(el("span", { "data-fact": "drift" }, `predictions ${pct(g.realised)} realised `, verdict));
  }
  parts.push(el("span", {}, `workers ${healthy} of ${workers.length} available`));
  parts.push(el("span", { class: "muted" }, `window ${g.window_s} s`));
  $("gateway").replaceChildren(...parts);
}

// ---- the workers table ---------------------------------------------------------------------------------

function healthCell(w) {
  if (w.draining) return tag("draining", "warn");
  return w.healthy ? tag("healthy", "ok") : tag("down", "bad");
}

function kvCell(usage) {
  const bar = el("span", { class: usage >= 0.9 ? "bar high" : "bar" }, el("i"));
  bar.firstChild.style.width = Math.min(100, Math.max(0, usage * 100)).toFixed(0) + "%";
  return el("td", { class: "n kv" }, pct(usage), bar);
}

function hitCell(w) {
  const win = w.window;
  const text = `${pct(win.predicted_hit)} / ${pct(win.reported_hit)}`;
  const title = win.realised === null ? "no prediction checked in the window"
    : `${pct(win.realised)} of predicted tokens realised over ${win.checked} requests`;
  return el("td", { class: "n", "data-col": "hit", title }, text, w.drift ? tag(" ⚠ drift", "bad") : null);
}

function actionCell(w) {
  if (w.draining) {
    return el("td", { class: "act" }, el("button", { "data-action": "undrain", "data-id": w.id }, "undrain"));
  }
  const armed = (ui.armed.get(w.id) || 0) > Date.now();
  const button = el("button", { "data-action": "drain", "data-id": w.id, class: armed ? "armed" : null,
    title: "stop new requests; the worker is removed once its requests finish" },
  armed ? "confirm drain" : "drain");
  return el("td", { class: "act" }, button);
}

function workerRow(w) {
  const eng = w.engine;
  const engine = eng.kind + (eng.version ? " " + eng.version : "");
  const role = w.pool ? `${w.role} → ${w.pool.pool}` : w.role;
  const cls = w.draining ? "draining" : !w.healthy || w.breaker === "open" ? "down" : "";
  const breaker = w.breaker === "closed" ? tag("closed", "muted") : tag(w.breaker, "bad");
  const index = el("td", { "data-col": "index", title: w.index.note || eng.load_note },
    w.index.mode === "precise" || w.index.mode === "approximate" ? w.index.mode : tag(w.index.mode, "warn"));
  return el("tr", { class: cls, "data-worker": w.id },
    el("td", { class: "id", title: w.url }, w.id),
    el("td", { "data-col": "engine", title: `load: ${eng.load_signal}; detected by ${eng.detected_by}` }, engine),
    el("td", { title: w.pool ? w.pool.reason : null }, role),
    el("td", { "data-col": "health" }, healthCell(w)),
    el("td", {}, breaker),
    el("td", { class: "n", "data-col": "running" }, num(w.running)),
    el("td", { class: "n" }, num(w.queue)),
    el("td", { class: "n", "data-col": "inflight" }, num(w.inflight)),
    kvCell(w.kv_usage),
    index,
    el("td", { class: "n", "data-col": "blocks" }, num(w.index.blocks)),
    el("td", { class: "n", "data-col": "rps", title: `${w.window.requests} requests, ${w.window.errors} failed` },
      rate(w.window.requests_per_s), w.window.errors ? tag(` (${w.window.errors} err)`, "bad") : null),
    el("td", { class: "n", "data-col": "ttft" }, ms(w.window.ttft_p50_s)),
    hitCell(w),
    actionCell(w),
  );
}

function goneRow(id, spec) {
  return el("tr", { class: "gone", "data-worker": id, "data-gone": "" },
    el("td", { class: "id", title: spec.url }, id),
    el("td", { colspan: 13 }, "drained and removed (it had no request left); register it again to send it traffic"),
    el("td", { class: "act" }, el("button", { "data-action": "readd", "data-id": id }, "add back")),
  );
}

function matches(w, words) {
  if (!words.length) return true;
  const state = w.draining ? "draining" : w.healthy ? "healthy" : "down";
  const hay = [w.id, w.url, w.role, w.engine.kind, w.pool && w.pool.pool, state, w.index.mode]
    .join(" ").toLowerCase();
  return words.every((word) => hay.includes(word));
}

function renderWorkers() {
  const state = ui.state;
  if (!state) return;
  const words = $("filter").value.toLowerCase().split(/\s+/).filter(Boolean);
  const shown = state.workers.filter((w) => matches(w, words));
  const rows = shown.map(workerRow);
  for (const [id, spec] of ui.gone) rows.push(goneRow(id, spec));
  $("workers").tBodies[0].replaceChildren(...rows);
  const of = shown.length === state.workers.length ? "" : ` (${shown.length} shown)`;
  $("counts").textContent = `${state.workers.length} workers${of}`;
}

// ---- recent decisions ----------------------------------------------------------------------------------

function candidates(d) {
  const out = [];
  for (const c of d.candidates) {
    const score = c.score === null ? "–" : c.score.toFixed(2);
    const text = `${c.id} ${score}, ${num(c.hit_tokens)}t, ${c.inflight}+${c.queue}`;
    if (out.length) out.push(" · ");
    out.push(el("span", { class: c.id === d.worker ? "pick" : c.healthy ? null : "muted" }, text));
  }
  return out;
}

function renderDecisions(decisions) {
  const rows = decisions.map((d) => el("tr", {},
    el("td", { class: "n" }, age(d.age_s)),
    el("td", {}, d.model),
    el("td", { class: "n" }, num(d.prompt_tokens)),
    el("td", { class: "n" }, num(d.blocks)),
    el("td", { class: "id pick" }, d.worker + (d.prefill_worker ? ` (prefill ${d.prefill_worker})` : "")),
    el("td", { class: "reason" }, d.reason || "–"),
    el("td", { class: "cands" }, ...candidates(d)),
  ));
  if (!rows.length) rows.push(el("tr", {}, el("td", { colspan: 7, class: "muted" }, "no request routed yet")));
  $("decisions").tBodies[0].replaceChildren(...rows);
}

// ---- polling -------------------------------------------------------------------------------------------

function noteGone(workers) {
  const listed = new Set(workers.map((w) => w.id));
  for (const [id, last] of ui.seen) {
    if (!listed.has(id) && last.draining) ui.gone.set(id, { url: last.url, role: last.role });
  }
  for (const id of listed) ui.gone.delete(id);
  ui.seen = new Map(workers.map((w) => [w.id, { url: w.url, role: w.role, draining: w.draining }]));
}

async function poll() {
  clearTimeout(ui.timer);
  try {
    const state = await api("GET", "/admin/ui/state");
    $("keybar").hidden = true;
    noteGone(state.workers);
    ui.state = state;
    gatewayLine(state.gateway, state.workers);
    renderWorkers();
    renderDecisions(state.decisions);
    ui.polls += 1;
    document.body.dataset.polls = String(ui.polls);
    $("updated").textContent = "updated " + new Date().toLocaleTimeString();
  } catch (err) {
    $("updated").textContent = "not updated: " + err.message;
    $("updated").className = "bad";
    ui.timer = setTimeout(poll, POLL_MS);
    return;
  }
  $("updated").className = "muted";
  ui.timer = setTimeout(poll, POLL_MS);
}

// ---- actions -------------------------------------------------------------------------------------------

async function act(action, id) {
  const path = "/admin/workers/" + encodeURIComponent(id).replace(/%3A/gi, ":");
  if (action === "drain" && !((ui.armed.get(id) || 0) > Date.now())) {
    ui.armed.set(id, Date.now() + CONFIRM_MS);
    renderWorkers();
    setTimeout(renderWorkers, CONFIRM_MS + 50);
    return;
  }
  ui.armed.delete(id);
  try {
    if (action === "drain") {
      const w = await api("DELETE", path);
      ui.seen.set(id, { url: w.url, role: w.role, draining: true });
      say(`${id} is draining: no new requests; removed once its ${w.inflight} in flight finish`, "ok");
    } else if (action === "undrain") {
      await api("POST", path + "/undrain");
      say(`${id} takes requests again`, "ok");
    } else if (action === "readd") {
      const spec = ui.gone.get(id);
      await api("POST", "/admin/workers", { url: spec.url, role: spec.role, id });
      ui.gone.delete(id);
      say(`${id} registered again`, "ok");
    }
  } catch (err) {
    say(err.message, "bad");
  }
  await poll();
}

$("workers").addEventListener("click", (event) => {
  const button = event.target.closest("button[data-action]");
  if (button) act(button.dataset.action, button.dataset.id);
});

$("filter").addEventListener("input", renderWorkers);

$("keybar").addEventListener("submit", (event) => {
  event.preventDefault();
  sessionStorage.setItem(KEY_ITEM, $("key").value.trim());
  $("key").value = "";
  $("keynote").textContent = "";
  poll();
});

poll();

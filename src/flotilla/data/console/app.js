// Flotilla console: plain JavaScript, no framework, no build step. Each page polls cheap, token-checked
// /v1 routes every POLL_MS while the tab is visible and redraws only when the answer changed.
"use strict";

const POLL_MS = 2000;
const TOKEN_KEY = "flotilla.token";
const COLLAPSE_OVER = 64;  // the GPU map opens racks one by one above this many nodes
const state = { who: null, page: null, timer: null, last: "", rackOpen: new Map(), racksOpenByDefault: null,
                horizonHours: 24, decisionFilter: {}, jobFilter: {}, nodeFilter: {}, cursor: {} };
const PAGE_SIZE = 200;

// ---------- DOM helper: text always goes in as text, never as HTML ----------

function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k === "class") el.className = v;
    else if (k === "text") el.textContent = v;
    else if (k === "style") el.style.cssText = v;  // CSSOM: allowed by the CSP, unlike a style attribute
    else if (k.startsWith("on")) el.addEventListener(k.slice(2), v);
    else if (k === "dataset") Object.assign(el.dataset, v);
    else el.setAttribute(k, v === true ? "" : v);
  }
  for (const c of children.flat(Infinity)) {
    if (c === null || c === undefined || c === false) continue;
    el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return el;
}
const svgNS = "http://www.w3.org/2000/svg";
function s(tag, attrs, ...children) {
  const el = document.createElementNS(svgNS, tag);
  for (const [k, v] of Object.entries(attrs || {})) el.setAttribute(k, v);
  for (const c of children) el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  return el;
}

// ---------- API ----------

class ApiError extends Error {
  constructor(status, message) { super(message); this.status = status; }
}

async function api(path, options = {}) {
  const token = sessionStorage.getItem(TOKEN_KEY);
  const headers = { Authorization: `Bearer ${token}`, ...(options.headers || {}) };
  if (options.body !== undefined) headers["Content-Type"] = "application/json";
  const r = await fetch(path, { method: options.method || "GET", headers, cache: "no-store",
                                body: options.body === undefined ? undefined : JSON.stringify(options.body) });
  const text = await r.text();
  let body = null;
  try { body = text ? JSON.parse(text) : null; } catch { body = { raw: text }; }
  if (r.status === 401) { signOut("The token was refused (401): sign in again."); throw new ApiError(401, "unauthorized"); }
  if (!r.ok && !options.keepErrors) throw new ApiError(r.status, (body && body.error && body.error.message) || r.statusText);
  return options.keepErrors ? { status: r.status, body } : body;
}

const q = (params) => {
  const u = new URLSearchParams();
  for (const [k, v] of Object.entries(params)) if (v !== undefined && v !== null && v !== "") u.set(k, v);
  const str = u.toString();
  return str ? `?${str}` : "";
};
const enc = encodeURIComponent;

// ---------- formatting ----------

const dateFormat = new Intl.DateTimeFormat(undefined, { dateStyle: "short", timeStyle: "medium" });  // made once: slow to make
const fmtTime = (iso) => iso ? dateFormat.format(new Date(iso)) : "—";
function fmtIn(iso) {
  if (!iso) return "";
  const s = (new Date(iso) - Date.now()) / 1000;
  const a = Math.abs(s);
  const t = a < 90 ? `${Math.round(a)} s` : a < 5400 ? `${Math.round(a / 60)} min` : a < 172800 ? `${(a / 3600).toFixed(1)} h` : `${Math.round(a / 86400)} d`;
  return s >= 0 ? `in ${t}` : `${t} ago`;
}
const badge = (word, label) => h("span", { class: `badge ${word}` }, label || word);
const isAdmin = () => state.who && state.who.role === "admin";
function hue(i) { return (i * 137.508) % 360; }  // golden angle: neighbouring jobs get distant hues
const jobColour = (i) => `hsl(${hue(i)}, 55%, 38%)`;
function jobLink(key) { return h("a", { href: `#/training/${key}` }, key); }

// ---------- actions (admin): confirm, call, show the answer ----------

function confirmAction(text) {
  const dlg = document.getElementById("confirm");
  document.getElementById("confirm-text").textContent = text;
  dlg.returnValue = "";
  dlg.showModal();
  return new Promise((resolve) => dlg.addEventListener("close", () => resolve(dlg.returnValue === "ok"), { once: true }));
}

// crypto.randomUUID exists only in secure contexts (HTTPS, localhost); getRandomValues everywhere.
const randomHex = (n) => Array.from(crypto.getRandomValues(new Uint8Array(n)), (b) => b.toString(16).padStart(2, "0")).join("");

async function act(what, method, path, body) {
  const box = document.getElementById("answer");
  // The last action's answer goes before the new confirmation, so nothing can read it as this one's.
  box.hidden = true;
  box.replaceChildren();
  if (!(await confirmAction(what))) return;
  box.hidden = false;
  box.replaceChildren(h("p", {}, "Sending…"));
  try {
    const { status, body: answer } = await api(path, { method, body, keepErrors: true,
      headers: { "Idempotency-Key": `console-${randomHex(16)}` } });
    box.className = status >= 400 ? "refused" : "";
    box.replaceChildren(
      h("h2", {}, `${status >= 400 ? "Refused" : "Done"}: ${method} ${path} → ${status}`),
      h("pre", { "data-answer-status": status }, JSON.stringify(answer, null, 2)),
      h("button", { type: "button", onclick: () => { box.hidden = true; box.replaceChildren(); } }, "Close"));
  } catch (e) {
    box.className = "refused";
    box.replaceChildren(h("p", {}, `Failed: ${e.message}`));
  }
  box.querySelector("button")?.focus();
  refresh(true);
}

// ---------- pages ----------

const pages = {
  map: { title: "GPU map", load: () => api("/v1/gpumap"), render: renderMap },
  training: { title: "Training", load: loadTraining, render: renderTraining },
  job: { title: "Training job", load: (k) => api(`/v1/jobs/${k}`), render: renderJob },
  serving: { title: "Serving", load: loadServing, render: renderServing },
  servingOne: { title: "Serving deployment", load: (k) => Promise.all([api(`/v1/serving/${k}`),
    api(`/v1/serving/${k}/history${q({ limit: 100 })}`)]), render: renderServingOne },
  nodes: { title: "Nodes and health", render: renderNodes,
           load: () => api(`/v1/nodes${q({ limit: PAGE_SIZE, cursor: state.cursor.nodes, ...state.nodeFilter })}`) },
  node: { title: "Node", load: (k) => Promise.all([api(`/v1/nodes/${k}`), api(`/v1/nodes/${k}/history${q({ limit: 100 })}`)]),
          render: renderNode },
  queues: { title: "Teams", load: () => api("/v1/queues"), render: renderQueues },
  queue: { title: "Team", render: renderQueue, load: (k) => Promise.all([api(`/v1/queues/${k}`),
    api(`/v1/queues/${k}/usage${q({ limit: 1000, since: new Date(Date.now() - USAGE_HOURS * 3600e3).toISOString() })}`)]) },
  decisions: { title: "Decisions", load: () => api(`/v1/decisions${q({ limit: 200, ...state.decisionFilter })}`),
               render: renderDecisions },
};

function route() {
  const hash = location.hash.replace(/^#\/?/, "");
  const [first, ...rest] = hash.split("/");
  const arg = rest.map(decodeURIComponent).map(enc).join("/");
  if (first === "training" && rest.length === 2) return ["job", arg];
  if (first === "serving" && rest.length === 2) return ["servingOne", arg];
  if (first === "nodes" && rest.length === 1) return ["node", arg];
  if (first === "queues" && rest.length === 1) return ["queue", arg];
  if (pages[first]) return [first, null];
  return ["map", null];
}

async function refresh(force = false) {
  const [page, arg] = route();
  const view = document.getElementById("view");
  if (state.page !== `${page}:${arg}`) { state.page = `${page}:${arg}`; state.last = ""; force = true; }
  let data;
  try {
    data = await pages[page].load(arg);
  } catch (e) {
    if (e.status === 401) return;
    setStatus(`Could not load: ${e.message}`);
    if (force) view.replaceChildren(h("h2", {}, pages[page].title), h("p", { role: "alert" }, e.message));
    return;
  }
  if (state.page !== `${page}:${arg}`) return;  // navigated away while loading
  // What is drawn: a row's "updated" stamp moves with every watch event and changes nothing on the page.
  const text = JSON.stringify(data, (k, v) => (k === "updated" ? undefined : v));
  setStatus(`${state.who ? `${state.who.name} (${state.who.role})` : ""} · updated ${new Date().toLocaleTimeString()}`);
  if (!force && text === state.last) return;
  state.last = text;
  const focused = document.activeElement && document.activeElement.dataset.key;
  // What a person is typing survives the redraw: a form field they changed keeps its value and its focus.
  const edited = [...view.querySelectorAll("input[id], textarea[id]")]
    .filter((el) => el.value !== el.defaultValue).map((el) => [el.id, el.value]);
  const typing = view.contains(document.activeElement) && document.activeElement.id;
  const built = pages[page].render(data, arg);
  view.replaceChildren(...[built].flat(Infinity));
  document.title = `${pages[page].title} · Flotilla`;
  for (const [id, value] of edited) { const el = document.getElementById(id); if (el) el.value = value; }
  if (focused) view.querySelector(`[data-key="${CSS.escape(focused)}"]`)?.focus();
  else if (typing) document.getElementById(typing)?.focus();
  for (const a of document.querySelectorAll("header nav a")) {
    const p = a.dataset.page;
    const current = p === page || (p === "training" && page === "job") || (p === "serving" && page === "servingOne")
      || (p === "nodes" && page === "node") || (p === "queues" && page === "queue");
    if (current) a.setAttribute("aria-current", "page"); else a.removeAttribute("aria-current");
  }
  if (page === "map") document.body.dataset.mapReady = String(performance.now());
}

function setStatus(text) { document.getElementById("status").textContent = text; }

// ----- GPU map -----

function cellsOf(node, map) {
  // GPUs out of service on their own sit at their index; holders and spares fill the other places in order.
  const out = new Map((node.gpusOut || []).filter((o) => o.gpu < node.gpus).map((o) => [o.gpu, o.reason]));
  const rest = [];
  for (const [kind, index, gpus] of node.holders) {
    const key = kind === "t" ? map.training[index] : map.serving[index];
    for (let i = 0; i < gpus && rest.length < node.gpus - out.size; i++) rest.push({ kind, index, key, gpus });
  }
  const spare = node.state === "ok" ? "free" : node.state === "unhealthy" ? "unhealthy" : "cordoned";
  while (rest.length < node.gpus - out.size) rest.push({ kind: spare });
  const cells = [];
  for (let i = 0; i < node.gpus; i++) cells.push(out.has(i) ? { kind: "gpuout", reason: out.get(i) } : rest.shift());
  return cells;
}

const CELL = {
  free: { letter: "·", label: "free" }, cordoned: { letter: "–", label: "unschedulable" },
  unhealthy: { letter: "✕", label: "unhealthy" }, gpuout: { letter: "✕", label: "out of service" },
};

function cellElement(c, node, gi) {
  if (c.kind === "t" || c.kind === "s") {
    const training = c.kind === "t";
    const label = `${node.name} GPU ${gi}: ${training ? "training job" : "serving"} ${c.key} (${c.gpus} GPUs on this node)`;
    return h("a", { class: `cell ${training ? "training" : "serving"}`, href: `#/${training ? "training" : "serving"}/${c.key}`,
                    title: label, "aria-label": label, style: training ? `background:${jobColour(c.index)}` : null,
                    dataset: { holder: c.key, kind: training ? "training" : "serving" }, tabindex: "-1" },
             training ? "T" : "S");
  }
  const label = `${node.name} GPU ${gi}: ${CELL[c.kind].label}${c.reason ? ` (${c.reason})` : ""}`;
  return h("span", { class: `cell ${c.kind === "gpuout" ? "unhealthy gpuout" : c.kind}`, dataset: { gpu: String(gi) }, title: label, "aria-label": label, role: "img" }, CELL[c.kind].letter);
}

function nodeRow(node, map) {
  const cells = cellsOf(node, map);
  const summary = cells.reduce((m, c) => { m[c.key || c.kind] = (m[c.key || c.kind] || 0) + 1; return m; }, {});
  const text = Object.entries(summary).map(([k, n]) => `${n} ${CELL[k] ? CELL[k].label : k}`).join(", ");
  return h("div", { class: "node", role: "listitem", dataset: { node: node.name, state: node.state } },
    h("a", { class: "name", href: `#/nodes/${enc(node.name)}`, "data-key": `node:${node.name}`,
             "aria-label": `${node.name}, ${node.state === "ok" ? "healthy" : node.state}, ${node.gpus} GPUs: ${text}` },
      node.name),
    h("div", { class: "cells" }, cells.map((c, i) => cellElement(c, node, i))));
}

function aggregate(nodes, map) {
  const counts = { training: 0, serving: 0, free: 0, cordoned: 0, unhealthy: 0 };
  for (const n of nodes) for (const c of cellsOf(n, map)) {
    counts[c.kind === "t" ? "training" : c.kind === "s" ? "serving" : c.kind === "gpuout" ? "unhealthy" : c.kind]++;
  }
  return counts;
}
const AGG_COLOURS = { training: "#2f6fb5", serving: "var(--serving)", free: "var(--free)", cordoned: "#aaa",
                      unhealthy: "var(--unhealthy)" };

function renderMap(map) {
  const racks = new Map();
  for (const n of map.nodes) {
    if (!racks.has(n.rack)) racks.set(n.rack, []);
    racks.get(n.rack).push(n);
  }
  const all = aggregate(map.nodes, map);
  const byDefault = state.racksOpenByDefault ?? map.nodes.length <= COLLAPSE_OVER;
  const open = (rack) => state.rackOpen.has(rack) ? state.rackOpen.get(rack) : byDefault;
  const legend = h("ul", { class: "legend", "aria-label": "Legend" },
    h("li", {}, h("span", { class: "cell training", style: `background:${jobColour(0)}` }, "T"), "training job (one hue per job)"),
    h("li", {}, h("span", { class: "cell serving" }, "S"), "serving pool"),
    h("li", {}, h("span", { class: "cell free" }, "·"), "free"),
    h("li", {}, h("span", { class: "cell cordoned" }, "–"), "unschedulable (cordoned, not ready)"),
    h("li", {}, h("span", { class: "cell unhealthy" }, "✕"), "unhealthy"));
  const unhealthy = map.nodes.filter((n) => n.state === "unhealthy").length;
  const list = [];
  for (const [rack, nodes] of racks) {
    const counts = aggregate(nodes, map);
    const total = Object.values(counts).reduce((a, b) => a + b, 0) || 1;
    const isOpen = open(rack);
    const bad = nodes.filter((n) => n.state !== "ok");
    const summary = `${nodes.length} nodes · ${counts.training} training · ${counts.serving} serving · ${counts.free} free`
      + (bad.length ? ` · ${bad.length} node${bad.length > 1 ? "s" : ""} out of service` : "");
    const id = `rack-${rack}`.replace(/[^A-Za-z0-9_-]/g, "_");
    list.push(h("section", { class: "rack", dataset: { rack, unhealthy: String(nodes.filter((n) => n.state === "unhealthy").length) } },
      h("h3", {}, h("button", { type: "button", "aria-expanded": String(isOpen), "aria-controls": id, "data-key": `rack:${rack}`,
                                onclick: () => { state.rackOpen.set(rack, !isOpen); refresh(true); } },
        h("span", { "aria-hidden": "true" }, isOpen ? "▾" : "▸"), h("span", {}, rack),
        h("span", { class: "agg", role: "img", "aria-label": summary },
          Object.entries(counts).filter(([, n]) => n).map(([k, n]) =>
            h("span", { style: `width:${(100 * n) / total}%;background:${AGG_COLOURS[k]}`, title: `${n} ${k}` }))),
        h("span", { class: "agg-count" }, summary))),
      isOpen ? h("div", { class: "nodes", id, role: "list", "aria-label": `nodes of ${rack}` }, nodes.map((n) => nodeRow(n, map))) : null));
  }
  return [
    h("h2", {}, "GPU map"),
    h("p", { class: "question" }, "Which GPUs hold what? Every node is a row of GPU cells, grouped by rack; hover a cell for its holder, click it to open it."),
    h("p", { class: "totals" }, `${map.nodes.length} nodes, ${Object.values(all).reduce((a, b) => a + b, 0)} GPUs: `
      + `${all.training} training (${map.training.length} jobs), ${all.serving} serving (${map.serving.length} deployments), `
      + `${all.free} free, ${all.cordoned} unschedulable, ${all.unhealthy} unhealthy` + (unhealthy ? ` · ${unhealthy} unhealthy nodes` : "")),
    legend,
    h("div", { class: "actions" },
      h("button", { type: "button", onclick: () => openRacks(true, []) }, "Open all racks"),
      h("button", { type: "button", onclick: () => openRacks(false, []) }, "Close all racks"),
      h("button", { type: "button", onclick: () => openRacks(false, map.nodes.filter((n) => n.state !== "ok").map((n) => n.rack)) },
        "Open only racks with problems")),
    h("div", { id: "gpumap", "aria-label": "racks" }, list),
  ];
}

function openRacks(byDefault, except) {
  state.racksOpenByDefault = byDefault;
  state.rackOpen = new Map(except.map((r) => [r, !byDefault]));
  refresh(true);
}

// ----- Training -----

async function loadTraining() {
  const [jobs, plan] = await Promise.all([
    api(`/v1/jobs${q({ limit: PAGE_SIZE, cursor: state.cursor.training, ...state.jobFilter })}`), api("/v1/timeline")]);
  return { jobs, plan };
}

// "Next page" / "First page" for a paged list; the filters above it reset it.
function pager(name, page) {
  return h("div", { class: "actions" },
    state.cursor[name] ? h("button", { type: "button", onclick: () => { state.cursor[name] = undefined; refresh(true); } }, "First page") : null,
    page.nextCursor ? h("button", { type: "button", onclick: () => { state.cursor[name] = page.nextCursor; refresh(true); } }, "Next page") : null);
}

function filterForm(name, label, fields, current, apply) {
  return h("form", { class: "filters", "aria-label": label, onchange: (e) => {
    const fd = new FormData(e.currentTarget);
    apply(Object.fromEntries([...fd.entries()].filter(([, v]) => v !== "")));
    state.cursor[name] = undefined;
    refresh(true);
  }, onsubmit: (e) => e.preventDefault() },
  fields.map(([field, text, options]) => h("label", {}, text, h("select", { name: field },
    options.map(([v, t]) => h("option", { value: v, selected: (current[field] || "") === v }, t))))));
}

function progressBar(p) {
  const frac = p.totalSteps ? Math.min(1, p.steps / p.totalSteps) : 0;
  return h("span", {}, h("span", { class: "bar", role: "img", "aria-label": `${Math.round(frac * 100)} percent` },
    h("span", { style: `width:${frac * 100}%` })), ` ${p.steps.toLocaleString()} / ${p.totalSteps.toLocaleString()}`);
}

function renderTraining({ jobs, plan }) {
  const rows = jobs.items.map((j) => h("tr", { dataset: { job: j.key, phase: j.phase } },
    h("td", {}, h("a", { href: `#/training/${j.key}`, "data-key": `job:${j.key}` }, j.key)),
    h("td", {}, j.phase),
    h("td", { class: "num" }, `${j.gpus} / ${j.elasticity.minGPUs} / ${j.elasticity.maxGPUs}`),
    h("td", {}, progressBar(j.progress)),
    h("td", {}, fmtTime(j.deadline), h("br"), h("small", {}, fmtIn(j.deadline))),
    h("td", {}, fmtTime(j.estimatedCompletion)),
    h("td", {}, badge(j.outlook))));
  return [
    h("h2", {}, "Training"),
    h("p", { class: "question" }, "Which deadlines are at risk, and why was a job rejected? The timeline shows each admitted job's guaranteed share reserved until its deadline, against the schedulable GPUs."),
    timeline(plan),
    h("h3", {}, "Jobs"),
    filterForm("training", "filter jobs", [
      ["outlook", "Outlook", [["", "any"], ["at-risk", "at-risk"], ["missed", "missed"], ["rejected", "rejected"], ["on-track", "on-track"], ["done", "done"], ["no-deadline", "no deadline"]]],
      ["phase", "Phase", [["", "any"], ...["Pending", "Admitted", "Running", "Resharding", "Succeeded", "Failed", "Rejected"].map((p) => [p, p])]],
    ], state.jobFilter, (f) => { state.jobFilter = f; }),
    h("p", {}, `${jobs.items.length} jobs on this page${jobs.nextCursor ? "; more on the next" : ""}.`),
    h("table", { "aria-label": "training jobs" },
      h("thead", {}, h("tr", {}, ["Job", "Phase", "GPUs now / guaranteed / max", "Progress", "Deadline", "ETA", "Outlook"]
        .map((t, i) => h("th", { scope: "col", class: i === 2 ? "num" : null }, t)))),
      h("tbody", {}, rows)),
    pager("training", jobs),
  ];
}

function timeline(plan) {
  const now = Date.now();
  const capacity = plan.schedulableGpus;
  const admitted = plan.jobs;  // latest deadline first: the longest bands at the bottom make a staircase
  const serving = plan.servingGpus;  // what the serving plans hold: training is guaranteed what is left
  const reserved = serving + admitted.reduce((a, j) => a + j.guaranteedGPUs, 0);
  const W = 900, H = 220, L = 46, B = 24, T = 10, R = 10;
  const horizon = state.horizonHours * 3600e3;
  const top = Math.max(capacity, reserved, 1);
  const x = (t) => L + ((Math.min(t, now + horizon) - now) / horizon) * (W - L - R);
  const y = (g) => H - B - (g / top) * (H - B - T);
  const svg = s("svg", { viewBox: `0 0 ${W} ${H}`, role: "img", id: "timeline",
    "aria-label": `Reserved GPUs over the next ${state.horizonHours} hours: ${reserved} of ${capacity} schedulable GPUs, ${serving} by serving plans and the rest guaranteed to ${admitted.length} admitted jobs` });
  svg.append(s("line", { class: "axis", x1: L, y1: H - B, x2: W - R, y2: H - B }), s("line", { class: "axis", x1: L, y1: T, x2: L, y2: H - B }));
  for (let i = 0; i <= 4; i++) {
    const t = now + (horizon * i) / 4;
    svg.append(s("text", { x: x(t), y: H - 8, "text-anchor": i === 0 ? "start" : i === 4 ? "end" : "middle" },
      i === 0 ? "now" : `+${((state.horizonHours * i) / 4).toFixed(state.horizonHours < 8 ? 1 : 0)} h`));
  }
  svg.append(s("text", { x: 4, y: y(top) + 10 }, `${top}`), s("text", { x: 4, y: H - B }, "0"));
  let base = 0;
  if (serving) {
    const rect = s("rect", { x: x(now), y: y(serving), width: x(now + horizon) - x(now), height: y(0) - y(serving), class: "serving-band" });
    rect.append(s("title", {}, `serving plans: ${serving} GPUs`));
    svg.append(rect);
    if (y(0) - y(serving) >= 12) svg.append(s("text", { x: x(now) + 4, y: y(serving / 2) + 4, class: "on-dark" }, `serving plans · ${serving} GPUs`));
    base = serving;
  }
  admitted.forEach((j, i) => {
    const g = j.guaranteedGPUs;
    const end = new Date(j.deadline).getTime();
    const rect = s("rect", { x: x(now), y: y(base + g), width: Math.max(1, x(end) - x(now)), height: Math.max(0.5, y(base) - y(base + g)),
                             fill: `hsl(${hue(i)}, 55%, 55%)`, "data-job": j.key });
    rect.append(s("title", {}, `${j.key}: ${g} GPUs guaranteed until ${fmtTime(j.deadline)}${end > now + horizon ? " (beyond this view)" : ""}; holds ${j.gpus} now`));
    svg.append(rect);
    if (y(base) - y(base + g) >= 10) {
      svg.append(s("text", { x: x(now) + 4, y: y(base + g / 2) + 4 }, `${j.key} · ${g} GPUs${end > now + horizon ? " →" : ""}`));
    }
    base += g;
  });
  svg.append(s("line", { class: "cap", x1: L, x2: W - R, y1: y(capacity), y2: y(capacity) }),
             s("text", { x: W - R - 4, y: y(capacity) + 14, "text-anchor": "end" }, `schedulable GPUs: ${capacity}`));
  return h("div", { class: "timeline card" },
    h("div", { class: "filters" }, h("label", {}, "Horizon",
      h("select", { "aria-label": "timeline horizon", onchange: (e) => { state.horizonHours = Number(e.target.value); refresh(true); } },
        [2, 6, 24, 168, 720].map((n) => h("option", { value: n, selected: n === state.horizonHours }, n < 48 ? `${n} h` : `${n / 24} d`)))),
      h("span", {}, `${reserved} of ${capacity} schedulable GPUs reserved now: ${serving} by serving plans, the rest guaranteed to ${admitted.length} admitted jobs; `
        + `${Math.max(0, capacity - reserved)} left for a new job's guarantee. A job whose share does not fit under the line until its deadline is rejected.`)),
    svg);
}

function renderJob(j) {
  const key = `${j.namespace}/${j.name}`;
  return [
    h("h2", {}, `Training job ${key}`),
    h("p", {}, h("a", { href: "#/training" }, "← all jobs")),
    h("div", { class: "card" }, h("dl", { class: "facts" },
      h("dt", {}, "Phase"), h("dd", { "data-field": "phase" }, j.phase),
      h("dt", {}, "Outlook"), h("dd", {}, badge(j.outlook)),
      h("dt", {}, "GPUs now / guaranteed / max"), h("dd", {}, `${j.gpus} / ${j.elasticity.minGPUs} / ${j.elasticity.maxGPUs}`),
      h("dt", {}, "Placement"), h("dd", { "data-field": "placement" }, j.placement.length ? j.placement.map((p, i) =>
        [i ? ", " : "", h("a", { href: `#/nodes/${enc(p.node)}` }, p.node), ` (${p.gpus})`]) : "none"),
      h("dt", {}, "Progress"), h("dd", {}, progressBar(j.progress), ` at ${j.progress.stepsPerSecond.toFixed(2)} steps/s`),
      h("dt", {}, "Deadline"), h("dd", {}, `${fmtTime(j.deadline)} (${fmtIn(j.deadline)})`),
      h("dt", {}, "ETA"), h("dd", {}, fmtTime(j.estimatedCompletion)),
      h("dt", {}, "Priority"), h("dd", {}, String(j.priority)),
      h("dt", {}, "Team (queue)"), h("dd", { "data-field": "queue" }, j.queue ? queueLink(j.queue) : "none (the implicit queue)"),
      h("dt", {}, "Reshards"), h("dd", {}, String(j.reshards)),
      h("dt", {}, "Lent to serving"), h("dd", {}, loanList(j.lentTo, "serving")),
      h("dt", {}, "Checkpoint request"), h("dd", {}, j.checkpointRequest ? JSON.stringify(j.checkpointRequest) : "none"))),
    isAdmin() && !["Succeeded", "Failed", "Rejected"].includes(j.phase) ? jobActions(j, key) : null,
    h("h3", {}, "Latest decisions"), decisionTable(j.history),
  ];
}

function jobActions(j, key) {
  const path = `/v1/jobs/${key}`;
  const deadlineInput = h("input", { type: "datetime-local", id: "new-deadline", "aria-label": "new deadline (local time)" });
  const priorityInput = h("input", { type: "number", id: "new-priority", value: j.priority, min: -100, max: 100, "aria-label": "new priority" });
  return h("section", { class: "card", "aria-label": "actions" }, h("h3", {}, "Actions"), h("div", { class: "actions" },
    h("button", { type: "button", id: "act-checkpoint", onclick: () => act(
      `Ask ${key}'s workers to write a checkpoint now. The job pauses briefly while rank 0 saves; it keeps its GPUs.`,
      "POST", `${path}/checkpoint`, { reason: "requested from the console" }) }, "Request checkpoint"),
    h("form", { onsubmit: (e) => { e.preventDefault(); if (!deadlineInput.value) return;
      const when = new Date(deadlineInput.value);
      act(`Move ${key}'s deadline from ${fmtTime(j.deadline)} to ${when.toLocaleString()}. The allocator re-plans: the job may grow, shrink or be judged at risk.`,
          "PATCH", path, { deadline: when.toISOString() }); } },
      h("label", {}, "Deadline ", deadlineInput), h("button", { type: "submit" }, "Change deadline")),
    h("form", { onsubmit: (e) => { e.preventDefault();
      act(`Set ${key}'s priority from ${j.priority} to ${priorityInput.value}. The allocator re-plans with it.`,
          "PATCH", path, { priority: Number(priorityInput.value) }); } },
      h("label", {}, "Priority ", priorityInput), h("button", { type: "submit" }, "Change priority"))));
}

// ----- Serving -----

async function loadServing() {
  const [serving, map] = await Promise.all([api(`/v1/serving${q({ limit: 1000 })}`), api("/v1/gpumap")]);
  return { serving, granted: grantedBy(map) };
}

function grantedBy(map) {
  const out = {};
  for (const n of map.nodes) for (const [kind, i, g] of n.holders) if (kind === "s") out[map.serving[i]] = (out[map.serving[i]] || 0) + g;
  return out;
}

const pct = (x) => x === undefined || x === null ? "—" : `${(x * 100).toFixed(1)} %`;

function renderServing({ serving, granted }) {
  return [
    h("h2", {}, "Serving"),
    h("p", { class: "question" }, "Does each model meet its latency SLO, and with how many GPUs? P:D is prefill to decode instances."),
    h("table", { "aria-label": "serving deployments" },
      h("thead", {}, h("tr", {}, ["Deployment", "Mode", "P:D", "GPUs held / granted / planned", "Borrowed from training",
        "SLO attainment (observed / target)", "Load (req/s)", "Last plan"].map((t) => h("th", { scope: "col" }, t)))),
      h("tbody", {}, serving.items.map((d) => h("tr", { dataset: { serving: d.key } },
        h("td", {}, h("a", { href: `#/serving/${d.key}`, "data-key": `sd:${d.key}` }, d.key)),
        h("td", {}, d.plan.mode),
        h("td", {}, `${d.plan.prefillReplicas}:${d.plan.decodeReplicas}`),
        h("td", { class: "num" }, `${granted[d.key] || 0} / ${d.pool ? d.pool.grantedGPUs : "—"} / ${d.plan.gpus}`),
        h("td", {}, loanList(d.borrowedFrom, "job")),
        h("td", {}, `${pct(d.observed && d.observed.attainment)} / ${pct(d.slo && d.slo.attainment)}`),
        h("td", { class: "num" }, d.observed && d.observed.requestsPerSecond !== undefined ? d.observed.requestsPerSecond.toFixed(1) : "—"),
        h("td", {}, d.plan.reason || "—", h("br"), h("small", {}, fmtTime(d.plan.time))))))),
  ];
}

function loanList(loans, side) {
  if (!loans || !loans.length) return "none";
  return loans.map((l, i) => [i ? ", " : "", side === "job" ? jobLink(l.job) : h("a", { href: `#/serving/${l.serving}` }, l.serving),
                              ` (${l.gpus} GPUs)`]);
}

function renderServingOne([d, history]) {
  const loans = history.items.filter((x) => x.kind === "loan");
  return [
    h("h2", {}, `Serving deployment ${d.key}`),
    h("p", {}, h("a", { href: "#/serving" }, "← all deployments")),
    h("div", { class: "card" }, h("dl", { class: "facts" },
      h("dt", {}, "Mode"), h("dd", {}, d.plan.mode),
      h("dt", {}, "P:D"), h("dd", {}, `${d.plan.prefillReplicas}:${d.plan.decodeReplicas} (${d.plan.prefillGpusPerInstance} and ${d.plan.decodeGpusPerInstance} GPUs per instance)`),
      h("dt", {}, "GPUs planned"), h("dd", {}, String(d.plan.gpus)),
      h("dt", {}, "Team (queue)"), h("dd", { "data-field": "queue" }, d.queue ? queueLink(d.queue) : "none (the implicit queue)"),
      h("dt", {}, "SLO"), h("dd", {}, d.slo ? `TTFT ≤ ${d.slo.ttftMs} ms, TPOT ≤ ${d.slo.tpotMs} ms, for ${pct(d.slo.attainment)} of requests` : "—"),
      h("dt", {}, "Observed"), h("dd", {}, d.observed && Object.keys(d.observed).length ? JSON.stringify(d.observed) : "no statistics yet"),
      h("dt", {}, "Predicted goodput"), h("dd", {}, d.plan.predictedGoodput === null ? "—" : `${d.plan.predictedGoodput.toFixed(2)} req/s`),
      h("dt", {}, "Last plan"), h("dd", {}, `${d.plan.reason || "—"} (${fmtTime(d.plan.time)})`))),
    h("h3", {}, "Loans from training"),
    h("p", { "data-field": "borrowed" }, "Borrowed now: ", loanList(d.borrowedFrom, "job"),
      d.pool ? ` · the pool grants ${d.pool.grantedGPUs} GPUs` : ""),
    loans.length ? decisionTable(loans) : h("p", {}, "No loan in the decision history."),
    h("h3", {}, "Plan history"), decisionTable(history.items),
  ];
}

// ----- Teams (Queues) -----

const USAGE_HOURS = 24;
const queueLink = (name) => h("a", { href: `#/queues/${enc(name)}`, "data-key": `queue:${name}` }, name);
const gpuQuota = (qu) => (qu.spec.resources || []).find((r) => r.name === "nvidia.com/gpu") || { nominal: 0 };
const num = (x) => (x === undefined || x === null ? 0 : x);

// One bar per queue: its nominal share as the frame; what it uses inside it, what it borrows beyond it, what of
// it others use (lent). Each part is also said in words (aria-label and the table's cells).
function shareBar(qu, top) {
  const st = qu.status || {};
  const nominal = num(st.nominal ?? gpuQuota(qu).nominal), used = num(st.used), borrowed = num(st.borrowed), lent = num(st.lent);
  const own = Math.max(0, used - borrowed);
  const scale = (g) => `${(100 * g) / Math.max(top, 1)}%`;
  const label = `${qu.name}: nominal ${nominal} GPUs; uses ${used} (${own} of its own, ${borrowed} borrowed); lends ${lent}`;
  return h("span", { class: "share", role: "img", "aria-label": label, title: label, style: `width:${scale(Math.max(nominal, used + lent, 1))}` },
    h("span", { class: "own", style: `width:${(100 * own) / Math.max(nominal, used + lent, 1)}%` }),
    h("span", { class: "lent", style: `width:${(100 * lent) / Math.max(nominal, used + lent, 1)}%` }),
    h("span", { class: "borrowed", style: `width:${(100 * borrowed) / Math.max(nominal, used + lent, 1)}%` }));
}

function outlookBadges(o) {
  const shown = Object.entries(o || {}).filter(([, n]) => n);
  return shown.length ? shown.map(([k, n]) => [badge(k, `${n} ${k}`), " "]) : "no training jobs";
}

function queueOrder(items) {
  // A tree: each queue after its parent, children indented.
  const byParent = new Map();
  const names = new Set(items.map((x) => x.name));
  for (const x of items) {
    const p = x.spec.parent && names.has(x.spec.parent) ? x.spec.parent : "";
    if (!byParent.has(p)) byParent.set(p, []);
    byParent.get(p).push(x);
  }
  const out = [];
  const walk = (p, depth, seen) => { for (const x of byParent.get(p) || []) if (!seen.has(x.name)) {
    seen.add(x.name); out.push([x, depth]); walk(x.name, depth + 1, seen); } };
  const seen = new Set();
  walk("", 0, seen);
  for (const x of items) if (!seen.has(x.name)) out.push([x, 0]);  // a cycle: listed anyway
  return out;
}

function renderQueues(page) {
  const top = Math.max(1, ...page.items.map((x) => Math.max(num(x.status.nominal ?? gpuQuota(x).nominal),
                                                            num(x.status.used) + num(x.status.lent))));
  return [
    h("h2", {}, "Teams"),
    h("p", { class: "question" }, "What is each team guaranteed, what does it use, lend and borrow, and are its deadlines safe? "
      + "Each bar is the team's nominal share: dark is its own use, hatched what it lends to others, purple what it borrows beyond its share."),
    page.items.length ? h("table", { "aria-label": "queues" },
      h("thead", {}, h("tr", {}, ["Team (queue)", "Share", "Nominal", "Used", "Borrowed", "Lent", "Guaranteed", "Admitted / pending",
        "Weight", "Jobs' outlook"].map((t, i) => h("th", { scope: "col", class: i >= 2 && i <= 7 ? "num" : null }, t)))),
      h("tbody", {}, queueOrder(page.items).map(([x, depth]) => {
        const st = x.status || {};
        return h("tr", { dataset: { queue: x.name } },
          h("td", { style: `padding-left:${8 + depth * 18}px` }, depth ? "↳ " : "", queueLink(x.name)),
          h("td", {}, shareBar(x, top)),
          h("td", { class: "num", dataset: { field: "nominal" } }, String(num(st.nominal ?? gpuQuota(x).nominal))),
          h("td", { class: "num", dataset: { field: "used" } }, String(num(st.used))),
          h("td", { class: "num", dataset: { field: "borrowed" } }, String(num(st.borrowed))),
          h("td", { class: "num", dataset: { field: "lent" } }, String(num(st.lent))),
          h("td", { class: "num" }, String(num(st.guaranteed))),
          h("td", { class: "num" }, `${num(st.admitted)} / ${num(st.pending)}`),
          h("td", { class: "num" }, String(x.spec.weight ?? 1)),
          h("td", {}, outlookBadges(x.outlook)));
      }))) : h("p", {}, "No Queue objects: every job shares one implicit queue that holds every GPU."),
  ];
}

function usageChart(points, nominal) {
  const W = 900, H = 180, L = 40, B = 22, T = 10, R = 10;
  const now = Date.now(), start = now - USAGE_HOURS * 3600e3;
  const top = Math.max(1, nominal, ...points.map((p) => Math.max(p.used, p.nominal, p.used + p.lent)));
  const x = (t) => L + ((Math.max(t, start) - start) / (now - start)) * (W - L - R);
  const y = (g) => H - B - (g / top) * (H - B - T);
  const step = (field) => {
    if (!points.length) return "";
    let d = "";
    points.forEach((p, i) => { const px = x(new Date(p.time).getTime()), py = y(p[field]);
      d += i === 0 ? `M${px},${py}` : `H${px}V${py}`; });
    return `${d}H${x(now)}`;
  };
  const last = points[points.length - 1];
  const svg = s("svg", { viewBox: `0 0 ${W} ${H}`, role: "img", id: "usage",
    "aria-label": last ? `Over the last ${USAGE_HOURS} hours: now uses ${last.used} of a nominal ${last.nominal} GPUs, borrows ${last.borrowed}, lends ${last.lent}`
                       : `No usage recorded in the last ${USAGE_HOURS} hours` });
  svg.append(s("line", { class: "axis", x1: L, y1: H - B, x2: W - R, y2: H - B }), s("line", { class: "axis", x1: L, y1: T, x2: L, y2: H - B }),
             s("text", { x: 4, y: y(top) + 10 }, `${top}`), s("text", { x: 4, y: H - B }, "0"),
             s("text", { x: L, y: H - 6 }, `−${USAGE_HOURS} h`), s("text", { x: W - R, y: H - 6, "text-anchor": "end" }, "now"));
  for (const [field, cls] of [["nominal", "nominal"], ["used", "used"], ["borrowed", "borrowed"], ["lent", "lent"]]) {
    const path = s("path", { d: step(field), class: `line ${cls}` });
    path.append(s("title", {}, field));
    svg.append(path);
  }
  return h("div", { class: "timeline card" },
    h("ul", { class: "legend" }, ["nominal", "used", "borrowed", "lent"].map((f) => h("li", {}, h("span", { class: `sw ${f}` }), f))), svg);
}

function renderQueue([qu, usage]) {
  const st = qu.status || {};
  const g = gpuQuota(qu);
  const limit = (v, none) => (v === undefined || v === null ? none : `${v} GPUs`);
  const conditions = st.conditions || [];
  return [
    h("h2", {}, `Team ${qu.name}`),
    h("p", {}, h("a", { href: "#/queues" }, "← all teams")),
    h("div", { class: "card" }, h("dl", { class: "facts" },
      h("dt", {}, "Share (nominal)"), h("dd", { "data-field": "nominal" }, `${g.nominal} GPUs guaranteed: its deadlines are promised out of them`),
      h("dt", {}, "Borrowing limit"), h("dd", {}, limit(g.borrowingLimit, "no limit")),
      h("dt", {}, "Lending limit"), h("dd", {}, limit(g.lendingLimit, "all of its idle share")),
      h("dt", {}, "Weight"), h("dd", {}, String(qu.spec.weight ?? 1), " (share of idle GPUs)"),
      h("dt", {}, "Parent"), h("dd", {}, qu.spec.parent ? queueLink(qu.spec.parent) : "none (a root)"),
      h("dt", {}, "Sub-teams"), h("dd", {}, qu.children.length ? qu.children.map((c, i) => [i ? ", " : "", queueLink(c)]) : "none"),
      h("dt", {}, "Namespaces"), h("dd", {}, (qu.spec.namespaces || []).join(", ") || "none (jobs name the queue)"),
      h("dt", {}, "Uses now"), h("dd", { "data-field": "used" }, `${num(st.used)} GPUs (${num(st.borrowed)} borrowed), ${num(st.guaranteed)} promised to deadlines`),
      h("dt", {}, "Lends now"), h("dd", { "data-field": "lent" }, `${num(st.lent)} GPUs`),
      h("dt", {}, "Jobs"), h("dd", {}, `${num(st.admitted)} admitted, ${num(st.pending)} pending`),
      h("dt", {}, "Conditions"), h("dd", {}, conditions.length ? conditions.map((c, i) => [i ? "; " : "",
        `${c.type}=${c.status}`, c.reason ? ` (${c.reason}: ${c.message || ""})` : ""]) : "none"))),
    h("h3", {}, "Loans"),
    h("div", { class: "card", "aria-label": "loans" }, h("dl", { class: "facts" },
      h("dt", {}, "Lent to"), h("dd", { "data-field": "lent-to" }, queueLoans(qu.loans.lentTo)),
      h("dt", {}, "Borrowed from"), h("dd", { "data-field": "borrowed-from" }, queueLoans(qu.loans.borrowedFrom)))),
    h("h3", {}, `Usage over the last ${USAGE_HOURS} hours`), usageChart(usage.items, g.nominal),
    h("h3", {}, "Its training jobs' outlook"),
    qu.jobs.length ? h("table", { "aria-label": "training jobs of the team" },
      h("thead", {}, h("tr", {}, ["Job", "Phase", "GPUs now / guaranteed / max", "Progress", "Deadline", "ETA", "Outlook"].map((t) => h("th", { scope: "col" }, t)))),
      h("tbody", {}, qu.jobs.map((j) => h("tr", { dataset: { job: j.key, outlook: j.outlook } },
        h("td", {}, jobLink(j.key)), h("td", {}, j.phase),
        h("td", { class: "num" }, `${j.gpus} / ${j.elasticity.minGPUs} / ${j.elasticity.maxGPUs}`),
        h("td", {}, progressBar(j.progress)),
        h("td", {}, fmtTime(j.deadline), h("br"), h("small", {}, fmtIn(j.deadline))),
        h("td", {}, fmtTime(j.estimatedCompletion)), h("td", {}, badge(j.outlook)))))) : h("p", {}, "No training jobs in this queue."),
    h("h3", {}, "Its serving deployments"),
    qu.serving.length ? h("table", { "aria-label": "serving deployments of the team" },
      h("thead", {}, h("tr", {}, ["Deployment", "P:D", "GPUs planned", "SLO attainment (observed / target)"].map((t) => h("th", { scope: "col" }, t)))),
      h("tbody", {}, qu.serving.map((d) => h("tr", { dataset: { serving: d.key } },
        h("td", {}, h("a", { href: `#/serving/${d.key}` }, d.key)), h("td", {}, `${d.plan.prefillReplicas}:${d.plan.decodeReplicas}`),
        h("td", { class: "num" }, String(d.plan.gpus)),
        h("td", {}, `${pct(d.observed && d.observed.attainment)} / ${pct(d.slo && d.slo.attainment)}`))))) : h("p", {}, "No serving deployments in this queue."),
    h("h3", {}, "Reclaims (GPUs given back to their owner, through checkpoints)"), decisionTable(qu.reclaims),
    h("h3", {}, "Loans and quota changes"), decisionTable(qu.history),
  ];
}

function queueLoans(list) {
  if (!list || !list.length) return "none";
  return list.map((l, i) => [i ? ", " : "", queueLink(l.queue), ` (${l.gpus} GPUs)`]);
}

// ----- Nodes -----

function nodeState(n) { return !n.healthy ? "unhealthy" : !n.ready ? "notready" : n.unschedulable ? "cordoned" : "ok"; }

function renderNodes(nodes) {
  return [
    h("h2", {}, "Nodes and health"),
    h("p", { class: "question" }, "Which nodes are out of service, and on what evidence? Open a node for the detector's evidence and its history."),
    filterForm("nodes", "filter nodes", [
      ["healthy", "Health", [["", "any"], ["false", "unhealthy"], ["true", "healthy"]]],
      ["schedulable", "Schedulable", [["", "any"], ["false", "no (cordoned)"], ["true", "yes"]]],
    ], state.nodeFilter, (f) => { state.nodeFilter = f; }),
    h("table", { "aria-label": "nodes" },
      h("thead", {}, h("tr", {}, ["Node", "Domain", "State", "Health", "Taint", "GPUs allocated / total"].map((t) => h("th", { scope: "col" }, t)))),
      h("tbody", {}, nodes.items.map((n) => h("tr", { dataset: { node: n.name, state: nodeState(n) } },
        h("td", {}, h("a", { href: `#/nodes/${enc(n.name)}`, "data-key": `node:${n.name}` }, n.name)),
        h("td", {}, n.domain),
        h("td", {}, badge(nodeState(n), { ok: "ok", unhealthy: "✕ unhealthy", notready: "? not ready", cordoned: "⊘ cordoned" }[nodeState(n)])),
        h("td", {}, n.health ? `${n.health.reason || ""}: ${n.health.message || ""}` : "healthy"),
        h("td", {}, n.taint ? `flotilla.dev/unhealthy=${n.taint.value}:${n.taint.effect}` : "—"),
        h("td", { class: "num" }, `${n.gpus.allocated} / ${n.gpus.total}`))))),
    pager("nodes", nodes),
  ];
}

function evidenceOf(d) {
  const ev = d.inputs && d.inputs.evidence;
  if (!ev) return null;
  return h("dl", { class: "facts" }, Object.entries(ev).map(([k, v]) => [h("dt", {}, k), h("dd", {}, typeof v === "object" ? JSON.stringify(v) : String(v))]));
}

function renderNode([n, history]) {
  const detections = history.items.filter((d) => d.inputs && d.inputs.evidence);
  return [
    h("h2", {}, `Node ${n.name}`),
    h("p", {}, h("a", { href: "#/nodes" }, "← all nodes")),
    h("div", { class: "card", dataset: { state: nodeState(n) } }, h("dl", { class: "facts" },
      h("dt", {}, "State"), h("dd", { "data-field": "state" }, badge(nodeState(n))),
      h("dt", {}, "Conditions"), h("dd", {}, `Ready=${n.ready ? "True" : "False"}, FlotillaGPUHealthy=${n.healthy ? "True" : "False"}`
        + (n.health ? ` (${n.health.reason}: ${n.health.message})` : "")),
      h("dt", {}, "Schedulable"), h("dd", {}, n.unschedulable ? "no (cordoned)" : "yes"),
      h("dt", {}, "Taint"), h("dd", {}, n.taint ? `flotilla.dev/unhealthy=${n.taint.value}:${n.taint.effect}` : "none"),
      h("dt", {}, "Domain"), h("dd", {}, n.domain),
      h("dt", {}, "GPUs"), h("dd", {}, `${n.gpus.allocated} allocated to training of ${n.gpus.total}, ${n.gpus.free} free`),
      h("dt", {}, "GPUs out of service"), h("dd", { "data-field": "gpus-out" }, (n.gpus.outOfService || []).length
        ? n.gpus.outOfService.map((o) => `GPU ${o.gpu}: ${o.reason}`).join("; ") : "none"),
      h("dt", {}, "Jobs"), h("dd", {}, n.jobs.length ? n.jobs.map((k, i) => [i ? ", " : "", jobLink(k)]) : "none"))),
    isAdmin() ? h("section", { class: "card", "aria-label": "actions" }, h("h3", {}, "Actions"), h("div", { class: "actions" },
      h("button", { type: "button", id: "act-drain", class: "danger", onclick: () => act(
        `Drain ${n.name}: cordon it (no new work) and ask ${n.jobs.length ? n.jobs.join(", ") : "every job on it"} for a checkpoint, after which the operator moves ${n.jobs.length === 1 ? "it" : "them"} to other nodes.`,
        "POST", `/v1/nodes/${enc(n.name)}/drain`, { reason: "drained from the console" }) }, "Drain node"),
      h("button", { type: "button", id: "act-return", onclick: () => act(
        `Return ${n.name} to service: uncordon it, remove the flotilla.dev/unhealthy taint and mark its GPUs healthy. New work may be placed on it at once.`,
        "POST", `/v1/nodes/${enc(n.name)}/return-to-service`, { reason: "returned from the console" }) }, "Return to service"))) : null,
    h("h3", {}, "Evidence the detectors used"),
    detections.length ? detections.slice(0, 5).map((d) => h("div", { class: "card evidence" },
      h("p", {}, h("strong", {}, `${d.kind}`), ` at ${fmtTime(d.time)}: ${d.reason}`), evidenceOf(d)))
      : h("p", {}, "No detection on this node in its history."),
    h("h3", {}, "Latest samples"),
    n.evidence.latestSamples.length ? h("table", { "aria-label": "latest samples" },
      h("thead", {}, h("tr", {}, ["Metric", "GPU", "Value", "Time"].map((t) => h("th", { scope: "col" }, t)))),
      h("tbody", {}, n.evidence.latestSamples.map((x) => h("tr", {}, h("td", {}, x.metric), h("td", {}, x.gpu ?? "—"),
        h("td", { class: "num" }, String(x.value)), h("td", {}, fmtTime(x.time)))))) : h("p", {}, "No samples from an agent."),
    h("h3", {}, "History: faults, cordons, returns to service"), decisionTable(history.items),
  ];
}

// ----- Decisions -----

function objectLink(d) {
  if (d.objectKind === "TrainingJob") return h("a", { href: `#/training/${d.object}` }, d.object);
  if (d.objectKind === "ServingDeployment") return h("a", { href: `#/serving/${d.object}` }, d.object);
  if (d.objectKind === "Node") return h("a", { href: `#/nodes/${enc(d.object)}` }, d.object);
  if (d.objectKind === "Queue") return queueLink(d.object);
  return d.object;
}

function decisionTable(items) {
  if (!items.length) return h("p", {}, "No decisions.");
  return h("table", { "aria-label": "decisions" },
    h("thead", {}, h("tr", {}, ["Time", "Kind", "Object", "Actor", "Reason", "Inputs"].map((t) => h("th", { scope: "col" }, t)))),
    h("tbody", {}, items.map((d) => h("tr", { dataset: { kind: d.kind, object: d.object } },
      h("td", {}, fmtTime(d.time)), h("td", {}, d.kind), h("td", {}, `${d.objectKind} `, objectLink(d)),
      h("td", {}, d.actor), h("td", {}, d.reason),
      h("td", {}, h("details", {}, h("summary", {}, "inputs"), h("pre", {}, JSON.stringify(d.inputs, null, 1))))))));
}

function renderDecisions(page) {
  const f = state.decisionFilter;
  const field = (name, label, attrs = {}) => h("label", {}, label, h("input", { name, value: f[name] || "", ...attrs }));
  const toIso = (v) => v ? new Date(v).toISOString() : undefined;
  return [
    h("h2", {}, "Decisions"),
    h("p", { class: "question" }, "What did Flotilla and its admins decide, when, and why? Newest first; each entry links to its object."),
    h("form", { class: "filters", "aria-label": "filter decisions", onsubmit: (e) => {
      e.preventDefault();
      const fd = new FormData(e.target);
      state.decisionFilter = { kind: fd.get("kind"), objectKind: fd.get("objectKind"), object: fd.get("object"),
                               since: toIso(fd.get("since")), until: toIso(fd.get("until")) };
      refresh(true);
    } },
      field("kind", "Kind", { placeholder: "reshard, drain, reclaim, loan…" }),
      h("label", {}, "Object kind", h("select", { name: "objectKind" }, ["", "TrainingJob", "ServingDeployment", "Queue", "Node", "Controller"]
        .map((k) => h("option", { value: k, selected: (f.objectKind || "") === k }, k || "any")))),
      field("object", "Object", { placeholder: "namespace/name or node" }),
      h("label", {}, "Since", h("input", { name: "since", type: "datetime-local" })),
      h("label", {}, "Until", h("input", { name: "until", type: "datetime-local" })),
      h("button", { type: "submit" }, "Filter"),
      h("button", { type: "button", onclick: () => { state.decisionFilter = {}; refresh(true); } }, "Clear")),
    h("p", {}, `${page.items.length} shown${page.nextCursor ? " (the newest 200)" : ""}.`),
    decisionTable(page.items),
  ];
}

// ---------- sign-in and start ----------

function signOut(message) {
  sessionStorage.removeItem(TOKEN_KEY);
  state.who = null;
  clearInterval(state.timer);
  document.getElementById("view").replaceChildren();
  document.getElementById("login").hidden = false;
  document.getElementById("signout").hidden = true;
  document.getElementById("login-error").textContent = message || "";
  document.getElementById("token").focus();
}

async function start() {
  try {
    state.who = await api("/v1/whoami");
  } catch (e) {
    if (e.status !== 401) signOut(`The controller refused the token: ${e.message}`);
    return;
  }
  document.getElementById("login").hidden = true;
  document.getElementById("signout").hidden = false;
  document.body.dataset.role = state.who.role;
  await refresh(true);
  clearInterval(state.timer);
  state.timer = setInterval(() => { if (!document.hidden) refresh(); }, POLL_MS);
}

document.getElementById("login-form").addEventListener("submit", (e) => {
  e.preventDefault();
  sessionStorage.setItem(TOKEN_KEY, document.getElementById("token").value.trim());
  document.getElementById("token").value = "";
  start();
});
document.getElementById("signout").addEventListener("click", () => signOut("Signed out."));
window.addEventListener("hashchange", () => { refresh(true); document.getElementById("view").focus({ preventScroll: true }); });
document.addEventListener("visibilitychange", () => { if (!document.hidden && state.who) refresh(); });
if (sessionStorage.getItem(TOKEN_KEY)) start(); else signOut();

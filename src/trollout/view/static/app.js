// trollout view: the page. Plain JavaScript, no dependency, no build step.
//
// Everything from a run folder is data: every value reaches the page through el() and
// text(), which make elements and text nodes (never innerHTML), with control characters shown
// as their escapes. Routes are paths: /run/N, /run/N/rollout/S/T/K, /compare/A/B; the rollout
// table's filters live in the query string, so any page can be pasted in a chat.
"use strict";

const CUT = "__trollout_cut__";
const CONTROL = /[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069]/g;
const LINE_CONTROL = /[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069]/g;
const POLL_MS = 1500;

function escapeChar(c) {
  const n = c.charCodeAt(0);
  if (c === "\n") return "\\n";
  if (c === "\t") return "\\t";
  if (c === "\r") return "\\r";
  return n < 256 ? "\\x" + n.toString(16).padStart(2, "0") : "\\u" + n.toString(16).padStart(4, "0");
}
// Text for a block that keeps its lines (prompts, answers): newlines and tabs stay.
function visible(s) { return String(s).replace(CONTROL, escapeChar); }
// Text for one line (a table cell, a name): every control character escaped.
function visibleLine(s) { return String(s).replace(LINE_CONTROL, escapeChar); }

function text(s, block) {
  return document.createTextNode(block ? visible(s) : visibleLine(s));
}

// el("td", {class: "num"}, child, ...): children are nodes, or values shown as one-line text.
function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value === undefined || value === null || value === false) continue;
    if (key === "onclick" || key === "onchange" || key === "oninput" || key === "onkeydown") {
      node.addEventListener(key.slice(2), value);
    } else if (key === "width") {  // CSSOM, which the page's policy allows (a style attribute it refuses)
      node.style.width = value;
    } else if (key === "href") {
      node.setAttribute("href", safeHref(value));
    } else {
      node.setAttribute(key, String(value));
    }
  }
  for (const child of children.flat()) {
    if (child === undefined || child === null) continue;
    node.append(child instanceof Node ? child : text(child));
  }
  return node;
}

// Only our own paths are linked: a value from a row never becomes a URL of its own.
function safeHref(value) {
  const s = String(value);
  return s.startsWith("/") && !s.startsWith("//") ? s : "#";
}

async function api(path) {
  const response = await fetch(path, {headers: {accept: "application/json"}});
  const body = await response.json().catch(() => ({error: "the answer was not JSON"}));
  if (!response.ok) throw new Error(body.error || response.statusText);
  return body;
}

function num(x, digits = 3) {
  if (x === null || x === undefined) return "–";
  if (typeof x !== "number") return visibleLine(x);
  return Number.isInteger(x) ? String(x) : x.toFixed(digits);
}
function secs(x) { return x === null || x === undefined ? "–" : x < 10 ? x.toFixed(3) + " s" : x.toFixed(1) + " s"; }
function when(t) { return typeof t === "number" ? new Date(t * 1000).toISOString().replace("T", " ").slice(0, 19) + " UTC" : "–"; }
function json(v) { return JSON.stringify(v, null, 2); }

const main = () => document.getElementById("main");
function show(...nodes) { main().replaceChildren(...nodes); }
function crumbs(...nodes) { document.getElementById("crumbs").replaceChildren(...nodes); }
function fail(error) { show(el("p", {class: "error"}, String(error.message || error))); }

// A value of a row, cut by the server: a string, or a marker offering the rest ("show more").
function value(v, ctx, block = true) {
  if (v && typeof v === "object" && v[CUT]) return cutNode(v, ctx, block);
  if (typeof v === "string") return text(v, block);
  if (v === null || v === undefined) return text("");
  if (typeof v === "object") return el("pre", {}, text(json(v), true));
  return text(String(v));
}

function cutNode(marker, ctx, block) {
  if (marker[CUT] !== "text") {
    const more = marker.more ? `${marker.more} more ${marker[CUT]} not shown` : "nested too deep to show";
    return el("span", {class: "cutnote"}, `[${more}: see the raw JSON]`);
  }
  const span = el("span", {}, text(marker.text, block));
  let shown = marker.text.length;
  const note = el("span", {class: "cutnote"}, ` … ${(marker.length - shown).toLocaleString()} more characters`);
  const button = el("button", {class: "more", type: "button"}, "show more");
  button.addEventListener("click", async () => {
    const q = new URLSearchParams({src: ctx.src, path: JSON.stringify(marker.path), start: String(shown)});
    try {
      const slice = await api(`${ctx.base}/field?${q}`);
      span.append(text(slice.text, block));
      shown = slice.start + slice.text.length;
      if (shown >= slice.length) { note.remove(); button.remove(); }
      else note.textContent = ` … ${(slice.length - shown).toLocaleString()} more characters`;
    } catch (e) { note.textContent = ` (${visibleLine(e.message)})`; }
  });
  return el("span", {}, span, note, button);
}

// A generic JSON block whose cut strings still offer "show more" is more than a page needs;
// objects are shown as JSON text, cut markers included, and the raw row is one click away.
function jsonBlock(v) { return el("pre", {}, text(json(v), true)); }

// --- routes ----------------------------------------------------------------------------

async function route() {
  const parts = location.pathname.split("/").filter(Boolean);
  try {
    if (parts[0] === "run" && parts[2] === "rollout" && parts.length === 6) {
      await rolloutPage(parts[1], parts.slice(3).join("/"));
    } else if (parts[0] === "run" && parts.length === 2) {
      await runPage(parts[1]);
    } else if (parts[0] === "compare" && parts.length === 3) {
      await comparePage(parts[1], parts[2]);
    } else {
      await homePage();
    }
  } catch (e) { fail(e); }
}

async function homePage() {
  const runs = await api("/api/runs");
  if (runs.length === 1) { location.replace(`/run/0`); return; }
  const rows = runs.map((r) => el("tr", {},
    el("td", {}, el("a", {href: `/run/${r.number}`}, r.label)),
    el("td", {class: "mono"}, r.shards.join(", "))));
  const pairs = [];
  for (let a = 0; a < runs.length; a++) for (let b = a + 1; b < runs.length; b++) {
    pairs.push(el("li", {}, el("a", {href: `/compare/${a}/${b}`, "data-testid": "compare-link"},
      `${runs[a].label}  vs  ${runs[b].label}`)));
  }
  crumbs();
  show(el("h1", {}, "Runs"), el("table", {}, el("tr", {}, el("th", {}, "run"), el("th", {}, "rollouts files")), rows),
    el("h2", {}, "Side by side"), el("ul", {}, pairs));
}

// --- the run page ----------------------------------------------------------------------

const FILTERS = ["outcome", "class", "agent", "health", "rmin", "rmax", "q"];
const COLUMNS = [
  ["task", "task", true], ["rollout", "rollout", true], ["agent", "agent", false],
  ["reward", "reward", true], ["outcome", "outcome", false], ["class", "class", false],
  ["attempts", "attempts", true], ["latency", "latency", true], ["health", "health", false],
];

async function runPage(number) {
  const base = `/api/run/${number}`;
  const state = Object.fromEntries(new URLSearchParams(location.search));
  state.offset = Number(state.offset || 0);
  state.limit = Math.min(500, Number(state.limit || 50));
  let summary = await api(base);
  crumbs(text(" › "), el("span", {}, summary.label));
  document.title = `trollout view · ${visibleLine(summary.label)}`;
  const summaryBox = el("div", {id: "summary"});
  const tableBox = el("div", {id: "table"});
  show(el("h1", {}, summary.label), summaryBox, tableBox);
  renderSummary(summaryBox, summary, number, state, reloadTable);
  let version = summary.version;

  async function reloadTable() {
    const q = new URLSearchParams();
    for (const key of [...FILTERS, "sort", "desc", "offset", "limit"]) {
      if (state[key] !== undefined && state[key] !== "" && state[key] !== null) q.set(key, state[key]);
    }
    history.replaceState(null, "", `/run/${number}?${q}`);
    try {
      const page = await api(`${base}/rollouts?${q}`);
      renderTable(tableBox, page, summary, number, state, reloadTable);
    } catch (e) { tableBox.replaceChildren(el("p", {class: "error"}, e.message)); }
  }
  await reloadTable();
  setLive(summary.live, summary.indexing);
  if (summary.live) {
    const timer = setInterval(async () => {
      try {
        summary = await api(base);
        if (summary.version !== version) {
          version = summary.version;
          renderSummary(summaryBox, summary, number, state, reloadTable);
          await reloadTable();
        }
        setLive(summary.live, summary.indexing);
        if (!summary.live) clearInterval(timer);
      } catch (e) { /* the next poll tries again */ }
    }, POLL_MS);
  }
}

function setLive(live, indexing) {
  const badge = document.getElementById("live");
  badge.hidden = !live;
  badge.textContent = indexing ? "indexing…" : "live";
}

function kvTable(pairs) {
  return el("table", {class: "kv"}, pairs.filter(([, v]) => v !== undefined).map(([k, v]) =>
    el("tr", {}, el("td", {}, k), el("td", {}, v instanceof Node ? v : text(v === null ? "–" : v)))));
}

function renderSummary(box, s, number, state, reloadTable) {
  const m = s.manifest;
  const c = s.counts;
  const what = m ? kvTable([
    ["input", el("span", {class: "mono"}, m.input ?? "–")],
    ["input sha256", el("span", {class: "mono"}, m.input_sha256 ?? "–")],
    ["created", when(m.created_at)],
    ["trollout", m.trollout_version ?? "–"],
    ["run id", el("span", {class: "mono"}, m.run_id ?? "–")],
    ["agents", (m.deployment?.agents || []).join(", ") || "–"],
    ["environment servers", (m.deployment?.environment_servers || []).join(", ") || "–"],
    ["planned", `${num(m.expected_rollouts)} rollouts of ${num(m.tasks)} tasks`],
  ]) : el("p", {class: "muted"}, "No manifest: the run's settings are unknown (a copied rollouts file?).");
  const changed = m && Object.keys(m.settings_changed).length
    ? kvTable(Object.entries(m.settings_changed).map(([k, v]) => [k, el("span", {class: "mono"}, JSON.stringify(v))]))
    : el("p", {class: "muted"}, m ? "Every other setting is the default." : "");
  const expected = c.expected || 1;
  const progress = el("div", {},
    el("div", {class: "bar"},
      el("span", {class: "landed", width: `${100 * c.landed / expected}%`}),
      el("span", {class: "failed", width: `${100 * c.failed / expected}%`})),
    kvTable([
      ["landed", el("span", {id: "count-landed"}, `${c.landed} of ${c.expected}`)],
      ["failed", el("span", {id: "count-failed"}, String(c.failed))],
      ["pending", String(c.pending)],
      ["retried", `${c.retried} rollouts (${c.attempts} attempts in all)`],
      ["status", s.status ? (s.status.finished ? "finished" : s.status.closed ? "closed (not finished)" : "collecting") : "no status file"],
      ["latency", s.latency.n ? `p50 ${secs(s.latency.p50)} · p90 ${secs(s.latency.p90)} · p99 ${secs(s.latency.p99)} · max ${secs(s.latency.max)}` : "–"],
    ]));
  const setFilter = (key, v) => { state[key] = v; state.offset = 0; reloadTable(); };
  const classes = Object.entries(c.failure_classes);
  const failures = classes.length
    ? el("table", {}, el("tr", {}, el("th", {}, "class (did not land)"), el("th", {class: "num"}, "rollouts")),
      classes.map(([k, n]) => el("tr", {},
        el("td", {}, el("a", {href: "#table", onclick: () => setFilter("class", k)}, k)),
        el("td", {class: "num"}, String(n)))))
    : el("p", {class: "muted"}, "No rollout failed.");
  const health = Object.keys(c.health).length
    ? kvTable(Object.entries(c.health).map(([k, n]) => [k, el("a", {href: "#table", onclick: () => setFilter("health", k)}, String(n))]))
    : el("p", {class: "muted"}, "No health verdicts (rollout_verdicts.jsonl) in this run.");
  const links = [];
  if (s.report) links.push(el("a", {href: `/run/${number}/report`}, "HTML report"));
  box.replaceChildren(
    ...s.problems.map((p) => el("p", {class: "problem"}, p)),
    el("p", {class: "muted mono"}, s.shards.join(", "), " ", ...links),
    el("div", {class: "grid"},
      el("div", {class: "card"}, el("h3", {}, "What was run"), what, el("h3", {}, "Settings that differ from the defaults"), changed),
      el("div", {class: "card"}, el("h3", {}, "Progress"), progress),
      el("div", {class: "card"}, el("h3", {}, "Failure classes"), failures, el("h3", {}, "Health"), health)),
    el("h2", {}, "Metrics"), metricsTable(s),
  );
}

function estimate(e) {
  if (!e || e.value === null || e.value === undefined) return "–";
  const ci = e.ci_low !== null && e.ci_low !== undefined ? ` [${num(e.ci_low, 2)}, ${num(e.ci_high, 2)}]` : "";
  return `${num(e.value)}${ci}`;
}

function metricsTable(s) {
  if (!s.metrics.length) {
    const rows = Object.entries(s.counts.agents).map(([name, a]) => el("tr", {},
      el("td", {}, name), el("td", {class: "num"}, `${a.landed}`), el("td", {class: "num"}, `${a.failed}`),
      el("td", {class: "num"}, num(a.mean_reward))));
    return el("div", {},
      el("p", {class: "muted"}, "No aggregate metrics yet (written when the run ends, or by trollout aggregate); the live counts:"),
      el("table", {}, el("tr", {}, el("th", {}, "agent"), el("th", {class: "num"}, "landed"), el("th", {class: "num"}, "failed"), el("th", {class: "num"}, "mean reward so far")), rows));
  }
  const rows = [];
  for (const g of s.metrics) {
    const ex = g.failures_excluded || {}, z = g.failures_as_zero || {};
    const passes = Object.keys(ex).filter((k) => k.startsWith("pass@")).sort((a, b) => Number(a.slice(5)) - Number(b.slice(5)));
    const cov = g.coverage || {};
    rows.push(el("tr", {},
      el("td", {}, g.agent || g.environment_server || "–"),
      el("td", {class: "num"}, cov.expected ? `${cov.covered ?? cov.landed}/${cov.expected}` : "–"),
      el("td", {class: "num"}, estimate(ex.mean_reward)),
      el("td", {class: "num"}, estimate(z.mean_reward)),
      el("td", {}, passes.map((k) => el("div", {}, `${k}: ${estimate(ex[k])}`)))));
  }
  return el("table", {id: "metrics"},
    el("tr", {}, el("th", {}, "group"), el("th", {class: "num"}, "coverage"),
      el("th", {class: "num"}, "mean reward, failures excluded [95% CI]"),
      el("th", {class: "num"}, "failures as zero"), el("th", {}, "pass@k (failures excluded)")), rows);
}

function select(name, label, options, state, apply) {
  const node = el("select", {name, "data-filter": name},
    el("option", {value: ""}, "any"),
    options.map((o) => el("option", {value: o}, o)));
  node.value = state[name] || "";
  node.addEventListener("change", () => apply(name, node.value));
  return el("label", {}, label, node);
}

function renderTable(box, page, summary, number, state, reloadTable) {
  const apply = (key, v) => { state[key] = v; state.offset = 0; reloadTable(); };
  const search = el("input", {type: "search", name: "q", placeholder: "text in prompt or answer", value: state.q || ""});
  search.addEventListener("keydown", (e) => { if (e.key === "Enter") apply("q", search.value); });
  const range = (name, label) => {
    const input = el("input", {type: "number", step: "any", name, value: state[name] || ""});
    input.addEventListener("change", () => apply(name, input.value));
    return el("label", {}, label, input);
  };
  const filters = el("div", {class: "filters"},
    select("outcome", "outcome", ["landed", "failed", "pending"], state, apply),
    select("class", "class", summary.classes, state, apply),
    select("agent", "agent", summary.agents, state, apply),
    select("health", "health", ["healthy", "unhealthy", "unobserved", "none"], state, apply),
    range("rmin", "reward ≥"), range("rmax", "reward ≤"),
    el("label", {}, "search", search),
    el("button", {type: "button", onclick: () => apply("q", search.value)}, "search"),
    el("button", {type: "button", onclick: () => { for (const f of FILTERS) state[f] = ""; apply("offset", 0); }}, "clear"));
  const head = el("tr", {}, COLUMNS.map(([key, label, numeric]) => {
    const arrow = state.sort === key || (!state.sort && key === "task") ? (state.desc === "1" ? " ▼" : " ▲") : "";
    return el("th", {class: `sort${numeric ? " num" : ""}`, "data-sort": key, onclick: () => {
      state.desc = state.sort === key && state.desc !== "1" ? "1" : "0";
      state.sort = key; reloadTable();
    }}, label + arrow);
  }));
  const rows = page.rows.map((r) => el("tr", {"data-testid": "rollout-row", "data-id": r.id},
    el("td", {class: "num"}, el("a", {href: `/run/${number}/rollout/${r.id}`}, String(r.task))),
    el("td", {class: "num"}, String(r.rollout)),
    el("td", {}, r.agent),
    el("td", {class: "num"}, num(r.reward)),
    el("td", {class: `outcome-${r.outcome}`}, r.outcome),
    el("td", {}, r.class),
    el("td", {class: "num"}, String(r.attempts)),
    el("td", {class: "num"}, secs(r.latency)),
    el("td", {class: `health-${r.health}`}, r.health)));
  const last = Math.min(page.matched, page.offset + page.rows.length);
  const move = (to) => { state.offset = Math.max(0, to); reloadTable(); };
  const pager = el("div", {class: "pager"},
    el("button", {type: "button", disabled: page.offset <= 0, onclick: () => move(page.offset - state.limit)}, "‹ previous"),
    el("span", {id: "matched", "data-matched": page.matched, "data-total": page.total},
      page.matched ? `rollouts ${page.offset + 1}–${last} of ${page.matched}` : "no rollout matches",
      page.matched !== page.total ? ` (filtered from ${page.total})` : ""),
    el("button", {type: "button", disabled: last >= page.matched, onclick: () => move(page.offset + state.limit)}, "next ›"));
  box.replaceChildren(el("h2", {}, "Rollouts"), filters, pager, el("table", {id: "rollouts"}, head, rows));
}

// --- the rollout page ------------------------------------------------------------------

const KNOWN = new Set(["responses_create_params", "response", "reward", "reward_components",
  "ng_trajectory", "ng_model_call_capture", "ng_perf", "agent_ref", "task_source", "elapsed_seconds"]);

async function rolloutPage(number, id) {
  const base = `/api/run/${number}/rollout/${id}`;
  const r = await api(base);
  const s = r.summary;
  crumbs(text(" › "), el("a", {href: `/run/${number}`}, r.label), text(` › task ${s.task} rollout ${s.rollout}`));
  document.title = `trollout view · task ${s.task} rollout ${s.rollout}`;
  const landed = r.landed;
  const input = r.input || landed;
  const sections = [
    el("h1", {}, `Task ${s.task} · rollout ${s.rollout}`),
    el("p", {},
      el("span", {class: `badge outcome-${s.outcome}`, id: "outcome"}, s.outcome),
      s.class ? el("span", {class: "badge", id: "failure-class"}, s.class) : null,
      el("span", {class: "badge"}, `reward ${num(s.reward)}`),
      el("span", {class: "badge"}, `${s.attempts} attempt${s.attempts === 1 ? "" : "s"}`),
      el("span", {class: "badge"}, secs(s.latency)),
      s.agent ? el("span", {class: "badge"}, s.agent) : null,
      s.health ? el("span", {class: `badge health-${s.health}`}, `health: ${s.health}`) : null),
    ...r.notes.map((n) => el("p", {class: "problem"}, n)),
    el("h2", {}, "Prompt"), prompt(input, {base, src: r.input ? "input" : "landed"}),
  ];
  if (landed) {
    const ctx = {base, src: "landed"};
    sections.push(el("h2", {}, "Output"), output(landed.response, ctx));
    sections.push(el("h2", {}, "Reward and verifier"), verifier(landed, ctx));
  }
  sections.push(el("h2", {}, "Attempts"), attempts(r, base));
  if (landed && (landed.ng_trajectory || landed.ng_model_call_capture)) {
    sections.push(el("h2", {}, "Enrichment"), enrichment(landed, {base, src: "landed"}));
  }
  if (r.verdict) sections.push(el("h2", {}, "Health"), healthFindings(r.verdict));
  sections.push(el("h2", {}, "Raw JSON"), rawButtons(r, base));
  show(...sections);
}

function contentText(content, ctx) {
  if (typeof content === "string" || (content && content[CUT])) return value(content, ctx);
  if (Array.isArray(content)) {
    return el("span", {}, content.map((part) => {
      if (part && typeof part === "object" && !part[CUT]) {
        if ("text" in part) return el("div", {}, value(part.text, ctx));
        if ("refusal" in part) return el("div", {}, "refusal: ", value(part.refusal, ctx));
        return jsonBlock(part);
      }
      return value(part, ctx);
    }));
  }
  return content === undefined ? text("") : jsonBlock(content);
}

function message(role, body, extra) {
  const cls = ["user", "assistant", "system", "developer", "tool", "error"].includes(role) ? role : "";
  return el("div", {class: `msg ${cls}`}, el("div", {class: "role"}, role, extra ? ` · ${extra}` : ""), el("div", {class: "body"}, body));
}

// One Responses API item (input or output), readable.
function item(it, ctx) {
  if (typeof it === "string" || (it && it[CUT])) return message("user", value(it, ctx));
  if (!it || typeof it !== "object") return message("item", jsonBlock(it));
  const type = it.type || (it.role ? "message" : "item");
  if (type === "message") return message(it.role || "message", contentText(it.content, ctx));
  if (type === "reasoning") {
    const parts = [...(it.summary || []), ...(it.content || [])];
    return message("reasoning", contentText(parts, ctx));
  }
  if (type === "function_call") {
    let args = it.arguments;
    if (typeof args === "string") { try { args = json(JSON.parse(args)); } catch (e) { /* shown as sent */ } }
    return message("tool", el("div", {}, el("div", {class: "mono"}, `${visibleLine(it.name ?? "?")}(…)`), el("pre", {}, value(args, ctx))), `call ${it.call_id ?? ""}`);
  }
  if (type === "function_call_output") return message("tool", el("pre", {}, value(it.output, ctx)), `output of ${it.call_id ?? ""}`);
  return message(type, jsonBlock(it));
}

function prompt(row, ctx) {
  if (!row) return el("p", {class: "muted"}, "No materialized row for this rollout.");
  const params = row.responses_create_params;
  const parts = [];
  if (params && typeof params === "object") {
    if (params.instructions) parts.push(message("system", value(params.instructions, ctx), "instructions"));
    const input = params.input;
    if (Array.isArray(input)) parts.push(...input.map((it) => item(it, ctx)));
    else if (input !== undefined) parts.push(message("user", value(input, ctx)));
  }
  if (row.task_input !== undefined) {
    const ti = row.task_input;
    if (ti && typeof ti === "object" && !ti[CUT] && "prompt" in ti) parts.push(message("user", value(ti.prompt, ctx), "task input"));
    else parts.push(message("user", jsonBlock(ti), "task input"));
  }
  if (!parts.length) parts.push(jsonBlock(row));
  return el("div", {id: "prompt"}, parts);
}

function output(response, ctx) {
  if (!response || typeof response !== "object") return el("p", {class: "muted"}, "No response in the landed row.");
  const items = Array.isArray(response.output) ? response.output : [];
  const usage = response.usage ? el("p", {class: "muted"}, `usage: ${visibleLine(JSON.stringify(response.usage))}`) : null;
  if (!items.length) return el("div", {id: "output"}, jsonBlock(response));
  return el("div", {id: "output"}, items.map((it) => item(it, ctx)), usage);
}

function verifier(row, ctx) {
  const pairs = [["reward", num(row.reward)]];
  if (row.reward_components) pairs.push(["reward components", el("span", {class: "mono"}, JSON.stringify(row.reward_components))]);
  for (const [k, v] of Object.entries(row)) {
    if (KNOWN.has(k) || k.startsWith("_ng_") || k === CUT) continue;
    pairs.push([k, typeof v === "string" || (v && v[CUT]) ? el("span", {}, value(v, ctx)) : el("span", {class: "mono"}, JSON.stringify(v))]);
  }
  return kvTable(pairs);
}

function attempts(r, base) {
  const rows = r.attempts.map((a, n) => {
    const ctx = {base, src: `failure:${n}`};
    if (a.note !== undefined && Object.keys(a).length === 1) return el("tr", {}, el("td", {colspan: 8}, a.note));
    return el("tr", {"data-testid": "attempt"},
      el("td", {class: "num"}, String(a._ng_attempt_index ?? n)),
      el("td", {class: "outcome-failed"}, a._ng_failure_class ?? "–"),
      el("td", {}, a.failure_kind ?? "–"),
      el("td", {class: "num"}, a._ng_failure_http_status ?? "–"),
      el("td", {}, `${a._ng_failure_delivery ?? "–"}${a._ng_failure_terminal ? " · terminal" : ""}`),
      el("td", {}, value(a._ng_failure_message ?? "", ctx, false)),
      el("td", {}, a._ng_failure_response_body ? el("pre", {}, value(a._ng_failure_response_body, ctx)) : "–"),
      el("td", {class: "num"}, secs(a.elapsed_seconds)));
  });
  if (r.landed) {
    rows.push(el("tr", {"data-testid": "attempt"}, el("td", {class: "num"}, String(r.landed._ng_attempt_index ?? r.attempts.length)),
      el("td", {class: "outcome-landed"}, "landed"), el("td", {}, r.landed.failure_kind ?? "–"), el("td", {}, "–"),
      el("td", {}, "delivered"), el("td", {}, r.landed._ng_failure_class ? `landed with class ${visibleLine(r.landed._ng_failure_class)}` : ""),
      el("td", {}, "–"), el("td", {class: "num"}, secs(r.landed.elapsed_seconds))));
  }
  if (!rows.length) return el("p", {class: "muted"}, "No attempt has an outcome yet.");
  return el("table", {id: "attempts"}, el("tr", {}, ["attempt", "class", "kind", "status", "delivery", "message", "body", "latency"].map((h) => el("th", {}, h))), rows);
}

function enrichment(row, ctx) {
  const parts = [];
  const t = row.ng_trajectory;
  if (t && typeof t === "object") {
    const turns = Array.isArray(t.turns) ? t.turns : [];
    parts.push(el("h3", {}, `Trajectory: ${turns.length} turns, ${(t.model_calls || []).length} model calls, ${(t.tool_calls || []).length} tool calls`));
    for (const turn of turns) {
      if (!turn || typeof turn !== "object") continue;
      const body = el("div", {});
      if (turn.question !== undefined && turn.question !== null) body.append(el("div", {}, el("b", {}, "question: "), value(typeof turn.question === "string" ? turn.question : json(turn.question), ctx)));
      if (turn.reasoning_content) body.append(el("div", {}, el("b", {}, "reasoning: "), value(typeof turn.reasoning_content === "string" ? turn.reasoning_content : json(turn.reasoning_content), ctx)));
      if (turn.answer !== undefined && turn.answer !== null) body.append(el("div", {}, el("b", {}, "answer: "), value(typeof turn.answer === "string" ? turn.answer : json(turn.answer), ctx)));
      parts.push(message("assistant", body, `turn ${turn.turn_no ?? "?"} · ${(turn.model_calls || []).length} model calls`));
    }
    const calls = Array.isArray(t.model_calls) ? t.model_calls : [];
    if (calls.length) {
      parts.push(el("table", {}, el("tr", {}, ["call", "model", "status", "tokens in", "tokens out", "duration", "error"].map((h) => el("th", {}, h))),
        calls.map((c) => {
          const meta = c.response_metadata || {}, tok = c.token_stats || {};
          return el("tr", {}, el("td", {class: "mono"}, c.model_call_id ?? meta.response_id ?? "–"), el("td", {}, meta.model ?? "–"),
            el("td", {}, `${meta.status_code ?? "–"} ${meta.response_status ?? ""}`), el("td", {class: "num"}, num(tok.prompt_tokens)),
            el("td", {class: "num"}, num(tok.completion_tokens)), el("td", {class: "num"}, c.duration_ms !== undefined && c.duration_ms !== null ? `${num(c.duration_ms, 1)} ms` : "–"),
            el("td", {}, meta.error_category ?? ""));
        })));
    }
    if (Array.isArray(t.gaps) && t.gaps.length) parts.push(el("p", {class: "problem"}, "gaps: ", t.gaps.map((g) => `${visibleLine(g.code)}${g.detail ? " (" + visibleLine(g.detail) + ")" : ""}`).join(", ")));
  }
  const cap = row.ng_model_call_capture;
  if (cap && typeof cap === "object") {
    const m = cap.metrics || {};
    parts.push(el("h3", {}, "Model calls captured"), el("p", {}, `${num(m.num_calls)} calls · tokens in ${num(m.tokens_in)} · out ${num(m.tokens_out)} · latency ${num(m.latency_total_ms, 1)} ms`));
    const calls = Array.isArray(cap.calls) ? cap.calls : [];
    if (calls.length) {
      parts.push(el("table", {}, el("tr", {}, ["#", "model", "status", "tokens in", "tokens out", "latency", "tools", "error"].map((h) => el("th", {}, h))),
        calls.map((c) => el("tr", {}, el("td", {class: "num"}, num(c.call_index)), el("td", {}, c.model ?? "–"), el("td", {}, `${c.status_code ?? "–"} ${c.response_status ?? ""}`),
          el("td", {class: "num"}, num(c.tokens_in)), el("td", {class: "num"}, num(c.tokens_out)),
          el("td", {class: "num"}, c.latency_total_ms !== undefined && c.latency_total_ms !== null ? `${num(c.latency_total_ms, 1)} ms` : "–"),
          el("td", {}, (c.tool_calls || []).map((tc) => tc && tc.name).filter(Boolean).join(", ")), el("td", {}, c.error_category ?? "")))));
    }
    if (Array.isArray(cap.gaps) && cap.gaps.length) parts.push(el("p", {class: "problem"}, "gaps: ", cap.gaps.map((g) => visibleLine(g.code)).join(", ")));
  }
  return el("div", {id: "enrichment"}, parts);
}

function healthFindings(v) {
  const findings = Array.isArray(v.findings) ? v.findings : [];
  return el("div", {id: "health"},
    el("p", {}, el("span", {class: `badge health-${v.verdict}`}, `verdict: ${visibleLine(v.verdict ?? "?")}`),
      Array.isArray(v.unobserved) && v.unobserved.length ? `unobserved checks: ${v.unobserved.join(", ")}` : ""),
    findings.length ? el("table", {}, el("tr", {}, el("th", {}, "check"), el("th", {}, "where"), el("th", {}, "detail")),
      findings.map((f) => el("tr", {}, el("td", {}, f.check ?? "?"), el("td", {class: "mono"}, f.locator ? JSON.stringify(f.locator) : ""),
        el("td", {class: "mono"}, JSON.stringify(f.detail ?? {}))))) : el("p", {class: "muted"}, "No finding."));
}

function rawButtons(r, base) {
  const sources = [];
  if (r.input) sources.push(["materialized row", "input"]);
  r.attempts.forEach((_, n) => sources.push([`failed attempt ${n + 1}`, `failure:${n}`]));
  if (r.landed) sources.push(["landed row", "landed"]);
  if (r.verdict) sources.push(["verdict", "verdict"]);
  const out = el("div", {id: "raw"});
  const buttons = sources.map(([label, src]) => el("button", {type: "button", "data-src": src, onclick: async () => {
    try {
      const raw = await api(`${base}/raw?src=${encodeURIComponent(src)}`);
      let shown = raw.text;
      try { shown = json(JSON.parse(raw.text)); } catch (e) { /* cut: shown as read */ }
      out.replaceChildren(el("h3", {}, label), raw.cut ? el("p", {class: "cutnote"}, `first ${raw.text.length.toLocaleString()} of ${raw.length.toLocaleString()} bytes`) : null,
        el("pre", {}, text(shown, true)));
    } catch (e) { out.replaceChildren(el("p", {class: "error"}, e.message)); }
  }}, label));
  return el("div", {}, el("p", {}, buttons), out);
}

// --- two runs --------------------------------------------------------------------------

async function comparePage(a, b) {
  const state = Object.fromEntries(new URLSearchParams(location.search));
  state.offset = Number(state.offset || 0);
  const box = el("div", {});
  async function load() {
    const q = new URLSearchParams({offset: String(state.offset), limit: "100", diff: state.diff || "0"});
    history.replaceState(null, "", `/compare/${a}/${b}?${q}`);
    const c = await api(`/api/compare/${a}/${b}?${q}`);
    const [ra, rb] = c.runs;
    crumbs(text(" › "), el("a", {href: `/run/${a}`}, ra.label), text(" vs "), el("a", {href: `/run/${b}`}, rb.label));
    const side = (x, run) => x === null
      ? [el("td", {class: "muted"}, "absent"), el("td", {}, ""), el("td", {}, "")]
      : [el("td", {class: "num"}, num(x.mean_reward)),
        el("td", {}, Object.entries(x.outcomes).map(([k, n]) => `${k} ${n}`).join(", ")),
        el("td", {}, x.rollouts.map((r) => el("a", {class: `chip ${r.outcome}`, href: `/run/${run}/rollout/${r.id}`,
          title: `${r.outcome} ${r.class}`}, `#${r.rollout} ${num(r.reward, 2)}`)))];
    const rows = c.rows.map((row) => el("tr", {class: row.differs ? "differs" : "", "data-testid": "compare-row", "data-task": row.task},
      el("td", {class: "num"}, String(row.task)), ...side(row.a, a), ...side(row.b, b)));
    const only = el("input", {type: "checkbox", name: "diff"});
    only.checked = state.diff === "1";
    only.addEventListener("change", () => { state.diff = only.checked ? "1" : "0"; state.offset = 0; load(); });
    box.replaceChildren(
      el("h1", {}, `${visibleLine(ra.label)}  vs  ${visibleLine(rb.label)}`),
      el("p", {id: "differing", "data-differing": c.differing}, `${c.differing} of ${c.tasks} tasks differ (reward or outcomes); they come first. `,
        el("label", {}, only, " only those")),
      el("div", {class: "pager"},
        el("button", {type: "button", disabled: state.offset <= 0, onclick: () => { state.offset = Math.max(0, state.offset - 100); load(); }}, "‹ previous"),
        el("span", {}, `tasks ${c.rows.length ? state.offset + 1 : 0}–${state.offset + c.rows.length} of ${c.tasks}`),
        el("button", {type: "button", disabled: state.offset + c.rows.length >= c.tasks, onclick: () => { state.offset += 100; load(); }}, "next ›")),
      el("table", {id: "compare"},
        el("tr", {}, el("th", {class: "num"}, "task"), el("th", {class: "num"}, "A reward"), el("th", {}, "A outcomes"), el("th", {}, "A rollouts"),
          el("th", {class: "num"}, "B reward"), el("th", {}, "B outcomes"), el("th", {}, "B rollouts")), rows));
  }
  show(box);
  await load();
}

window.addEventListener("DOMContentLoaded", route);

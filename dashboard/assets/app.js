// tine dashboard: polls the /v1 API and renders the fork tree and the
// selected sandbox. No framework, no build step.
"use strict";

let selected = null;
// The audit log of the selected sandbox, fetched from where the last poll
// ended (records are numbered from 0).
const audit = { name: null, lines: [] };
const maxAuditLines = 500;
// The last CPU counter read of each sandbox, to turn two reads into a rate.
const lastCPU = new Map();
// A figure at or past this share of its limit is drawn red.
const nearLimit = 0.9;
const $ = (id) => document.getElementById(id);

async function api(method, path, body, asText) {
  // A call that hangs (a sandbox that stopped answering) must not stall
  // the page's polling.
  const opts = { method, headers: {}, signal: AbortSignal.timeout(10000) };
  if (body !== undefined) {
    opts.body = JSON.stringify(body);
    opts.headers["Content-Type"] = "application/json";
  }
  const res = await fetch("/v1" + path, opts);
  if (!res.ok) {
    let msg = res.status + " " + res.statusText;
    try { msg = (await res.json()).message || msg; } catch (e) { /* not JSON */ }
    throw new Error(msg);
  }
  const ct = res.headers.get("Content-Type") || "";
  if (res.status === 204) return null;
  return !asText && ct.includes("json") ? res.json() : res.text();
}

function say(msg, isError) {
  const s = $("status");
  s.textContent = msg;
  s.style.color = isError ? "#fbb" : "#cfc";
}

function el(tag, attrs, ...kids) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "class") e.className = v; else if (k.startsWith("data-")) e.setAttribute(k, v); else e[k] = v;
  }
  for (const k of kids) e.append(k);
  return e;
}

function bytes(n) {
  const u = ["B", "KiB", "MiB", "GiB"];
  let i = 0;
  while (n >= 1024 && i < u.length - 1) { n /= 1024; i++; }
  return (i ? n.toFixed(1) : n) + " " + u[i];
}

// frozenLabel says in a word or two why a sandbox is frozen (the full
// reason is the badge's tooltip and is shown in the detail pane).
function frozenLabel(why) {
  if (why === "frozen by a person") return "by hand";
  if (why === "idle") return "idle";
  if (why.startsWith("over its OS-layer bound")) return "OS layer full";
  if (why.startsWith("waiting for approval")) return "approval";
  return why;
}

// figures turns a sandbox's usage entry into the live figures drawn beside
// its limits: [key, label, used text, limit text or "", near the limit].
function figures(u) {
  if (!u || !u.usage) return [];
  const l = u.limits || {};
  const near = (used, limit) => limit > 0 && used >= nearLimit * limit;
  const out = [];
  out.push(["memory", "mem", bytes(u.usage.memory_bytes), l.memory_bytes ? bytes(l.memory_bytes) : "",
    near(u.usage.memory_bytes, l.memory_bytes)]);
  const cpu = u.cpu === undefined ? "–" : Math.round(u.cpu * 100) + "%";
  out.push(["cpu", "cpu", cpu, l.cpus ? Math.round(l.cpus * 100) + "%" : "", u.cpu !== undefined && near(u.cpu, l.cpus)]);
  out.push(["pids", "pids", String(u.usage.pids), l.pids ? String(l.pids) : "", near(u.usage.pids, l.pids)]);
  out.push(["project", "disk", bytes(u.project_bytes), l.project_bytes ? bytes(l.project_bytes) : "",
    near(u.project_bytes, l.project_bytes)]);
  // The OS layer as last measured (absent before the first measure),
  // beside the bound in force.
  if (u.usage.layer_bytes) {
    out.push(["layer", "os", bytes(u.usage.layer_bytes), bytes(u.layer_bound_bytes), near(u.usage.layer_bytes, u.layer_bound_bytes)]);
  }
  return out;
}

// withCPU sets each usage entry's cpu (CPUs used since the last poll)
// from its counter and the time of the two reads.
function withCPU(resp) {
  const t = Date.parse(resp.time);
  const seen = new Set();
  for (const u of resp.sandboxes) {
    seen.add(u.name);
    if (!u.usage) { lastCPU.delete(u.name); continue; }
    const prev = lastCPU.get(u.name);
    if (prev && t > prev.t && u.usage.cpu_ns >= prev.ns) u.cpu = (u.usage.cpu_ns - prev.ns) / ((t - prev.t) * 1e6);
    else if (prev && t === prev.t) u.cpu = prev.cpu;
    lastCPU.set(u.name, { t, ns: u.usage.cpu_ns, cpu: u.cpu });
  }
  for (const n of [...lastCPU.keys()]) if (!seen.has(n)) lastCPU.delete(n);
  return new Map(resp.sandboxes.map((u) => [u.name, u]));
}

// renderTree draws sandboxes nested under the one each was forked from,
// each with its state, why it is frozen, what of it waits for a person
// and its live usage beside its limits.
function renderTree(list, usage, waiting) {
  const byName = new Map(list.map((s) => [s.name, s]));
  const kids = new Map();
  const roots = [];
  for (const s of list) {
    if (s.forked_from && byName.has(s.forked_from)) {
      if (!kids.has(s.forked_from)) kids.set(s.forked_from, []);
      kids.get(s.forked_from).push(s);
    } else {
      roots.push(s);
    }
  }
  const node = (s) => {
    const u = usage.get(s.name);
    const label = el("span", { class: "node" + (s.name === selected ? " selected" : ""), "data-name": s.name },
      s.name, el("span", { class: "state " + s.state }, s.state));
    if (u && u.frozen) label.append(el("span", { class: "badge frozen", title: u.frozen, "data-why": u.frozen }, "frozen: " + frozenLabel(u.frozen)));
    const n = waiting.get(s.name) || 0;
    if (n) label.append(el("span", { class: "badge waiting" }, `${n} waiting`));
    // A frozen sandbox's agent cannot count its processes and ports.
    if (!(u && u.frozen)) label.append(el("span", { class: "usage" }, `${s.processes} proc · ${s.ports} ports`));
    // The OS layer shows in the tree only when near its bound.
    const figs = figures(u).filter(([key, , , , near]) => key !== "layer" || near);
    if (figs.length) {
      label.append(el("span", { class: "figs" }, ...figs.map(([key, name, used, limit, near]) =>
        el("span", { class: "fig" + (near ? " near" : ""), "data-usage": key }, `${name} ${used}` + (limit ? `/${limit}` : "")))));
    } else {
      label.append(el("span", { class: "figs" }, el("span", { class: "fig", "data-usage": "project" }, "disk " + bytes(s.project_bytes))));
    }
    label.onclick = () => { selected = s.name; refresh(); };
    const li = el("li", { "data-sandbox": s.name }, label);
    const ch = kids.get(s.name);
    if (ch) li.append(el("ul", {}, ...ch.map(node)));
    return li;
  };
  $("tree").replaceChildren(...roots.map(node));
  $("empty").hidden = list.length > 0;
}

async function renderDetail(sb, u, approvals) {
  $("detail").hidden = !sb;
  if (!sb) return;
  $("d-name").textContent = sb.name;
  $("d-info").textContent = `${sb.state} · from ${sb.from}` + (sb.forked_from ? ` · fork of ${sb.forked_from}` : "") +
    ` · project at ${sb.project_path}`;
  const name = encodeURIComponent(sb.name);
  const running = sb.state === "running";
  if (audit.name !== sb.name) { audit.name = sb.name; audit.lines = []; audit.next = 0; }
  const frozen = u && u.frozen;
  // A frozen sandbox's agent does not answer: no ps or ports then.
  const live = running && !frozen;
  const [ps, ports, diff, snaps, logs, exposures, auditText] = await Promise.all([
    live ? api("GET", `/sandboxes/${name}/ps`).catch(() => []) : [],
    live ? api("GET", `/sandboxes/${name}/ports`).catch(() => []) : [],
    api("GET", `/sandboxes/${name}/diff`).catch(() => []),
    api("GET", `/sandboxes/${name}/snapshots`).catch(() => []),
    api("GET", `/sandboxes/${name}/logs?tail=100`).catch(() => ""),
    api("GET", `/sandboxes/${name}/exposures`).catch(() => null),
    api("GET", `/sandboxes/${name}/audit?from=${audit.next}`, undefined, true).catch(() => ""),
  ]);
  if (audit.name !== sb.name) return; // another sandbox was selected meanwhile
  $("d-frozen").hidden = !frozen;
  $("d-frozen").textContent = !frozen ? "" : frozen.startsWith("frozen") ? frozen : "frozen: " + frozen;
  $("detail").dataset.frozen = frozen ? "yes" : "no";
  $("b-freeze").disabled = !running || !!frozen;
  $("b-thaw").disabled = !frozen;
  renderUsage(sb, u);
  const pending = approvals.filter((a) => a.sandbox === sb.name);
  $("approvals-pane").hidden = pending.length === 0;
  $("d-waiting").hidden = pending.length === 0;
  $("d-waiting").textContent = `${pending.length} waiting`;
  $("approvals").replaceChildren(...pending.map((a) => {
    const yes = el("button", { class: "approve" }, "Approve");
    const no = el("button", { class: "deny danger" }, "Deny");
    yes.onclick = () => act("approve", () => api("POST", `/approvals/${encodeURIComponent(a.id)}/approve`, {}));
    no.onclick = () => act("deny", () => api("POST", `/approvals/${encodeURIComponent(a.id)}/deny`, {}));
    return el("li", { "data-approval": a.id }, `${a.kind}: ${a.reason || ""}`, yes, no);
  }));
  const exposed = (exposures && exposures.exposures) || [];
  $("exposures").replaceChildren(...(exposed.length ? exposed.map((x) =>
    el("li", {}, `${x.port} → `, el("a", { href: x.url, target: "_blank", rel: "noopener noreferrer" }, x.url))) :
    [el("li", {}, "none")]));
  for (const line of (auditText || "").split("\n")) {
    if (!line) continue;
    try {
      const r = JSON.parse(line);
      audit.next = r.seq + 1;
      audit.lines.push(`${r.seq} ${r.time} ${r.kind} ${r.fields ? JSON.stringify(r.fields) : ""}`);
    } catch (e) { /* a cut line: fetched again next time */ }
  }
  if (audit.lines.length > maxAuditLines) audit.lines.splice(0, audit.lines.length - maxAuditLines);
  $("audit").textContent = audit.lines.join("\n") || "(empty)";
  $("ps").replaceChildren(...ps.map((p) => el("tr", {}, el("td", {}, String(p.pid)), el("td", {}, p.user || String(p.uid)),
    el("td", {}, p.state), el("td", {}, (p.argv && p.argv.length ? p.argv.join(" ") : `[${p.comm}]`)))));
  const isExposed = (port) => ((exposures && exposures.exposures) || []).some((x) => x.port === port);
  $("ports").replaceChildren(...ports.map((p) => {
    const li = el("li", {}, `${p.proto} ${p.address}:${p.port}` + (p.pid ? ` (pid ${p.pid})` : ""));
    if (p.proto.startsWith("tcp") && !isExposed(p.port)) {
      const b = el("button", { class: "expose", "data-port": String(p.port) }, "Expose");
      b.onclick = () => act("expose", () => api("POST", `/sandboxes/${name}/exposures`, { port: p.port }));
      li.append(" ", b);
    }
    return li;
  }));
  $("diff").replaceChildren(...(diff.length ? diff.map((c) => el("li", { class: "kind-" + c.kind }, `${c.kind} ${c.path}`)) : [el("li", {}, "no changes")]));
  $("snaps").replaceChildren(...snaps.map((s) => el("li", {}, `${s.id}` + (s.name ? ` (${s.name})` : "") + ` ${s.created}`)));
  $("logs").textContent = logs || "(no service output)";
}

// renderUsage fills the detail pane's table of limits and live usage.
function renderUsage(sb, u) {
  const rows = figures(u).map(([key, , used, limit, near]) => {
    const names = { memory: "Memory", cpu: "CPU", pids: "Processes (pids)", project: "Project bytes", layer: "OS layer (last measured)" };
    let extra = "";
    if (key === "memory" && u.usage.memory_peak_bytes) extra = ` (peak ${bytes(u.usage.memory_peak_bytes)})`;
    if (key === "memory" && u.usage.oom_kills) extra += ` · ${u.usage.oom_kills} OOM kill(s)`;
    return el("tr", { class: near ? "near" : "", "data-usage": key },
      el("th", {}, names[key]), el("td", { class: "used" }, used + extra), el("td", { class: "limit" }, limit ? "of " + limit : "no limit"));
  });
  if (!rows.length) {
    const l = sb.limits || {};
    const why = u && u.usage_error ? u.usage_error : "not running";
    rows.push(el("tr", { "data-usage": "project" }, el("th", {}, "Project bytes"), el("td", { class: "used" }, bytes(u ? u.project_bytes : sb.project_bytes)),
      el("td", { class: "limit" }, l.project_bytes ? "of " + bytes(l.project_bytes) : "no limit")));
    rows.push(el("tr", {}, el("th", {}, "Live usage"), el("td", { colSpan: 2 }, why)));
  }
  $("usage").replaceChildren(...rows);
}

async function refresh() {
  try {
    // One request each for the tree, whatever the number of sandboxes.
    const [list, usage, approvals] = await Promise.all([
      api("GET", "/sandboxes"),
      api("GET", "/usage").then(withCPU).catch(() => new Map()),
      api("GET", "/approvals").catch(() => []),
    ]);
    const pending = (approvals || []).filter((a) => a.state === "pending");
    const waiting = new Map();
    for (const a of pending) waiting.set(a.sandbox, (waiting.get(a.sandbox) || 0) + 1);
    if (selected && !list.some((s) => s.name === selected)) selected = null;
    renderTree(list, usage, waiting);
    await renderDetail(list.find((s) => s.name === selected), usage.get(selected), pending);
  } catch (e) {
    say(e.message, true);
  }
}

async function act(what, fn) {
  try {
    say(what + "…");
    await fn();
    say(what + ": done");
  } catch (e) {
    say(what + ": " + e.message, true);
  }
  await refresh();
}

$("create").onsubmit = (ev) => {
  ev.preventDefault();
  const body = { from: $("create-from").value.trim() };
  if ($("create-name").value.trim()) body.name = $("create-name").value.trim();
  act("create", async () => { selected = (await api("POST", "/sandboxes", body)).name; });
};
$("b-snapshot").onclick = () => act("snapshot", () => api("POST", `/sandboxes/${encodeURIComponent(selected)}/snapshots`, {}));
$("b-fork").onclick = () => act("fork", () => api("POST", `/sandboxes/${encodeURIComponent(selected)}/fork`, { n: Number($("fork-n").value) || 1 }));
$("b-freeze").onclick = () => act("freeze", () => api("POST", `/sandboxes/${encodeURIComponent(selected)}/freeze`, {}));
$("b-thaw").onclick = () => act("thaw", () => api("POST", `/sandboxes/${encodeURIComponent(selected)}/thaw`, {}));
$("b-rm").onclick = () => {
  if (confirm(`Remove sandbox ${selected} and its files?`)) act("remove", () => api("DELETE", `/sandboxes/${encodeURIComponent(selected)}`));
};
// Promote shows its plan (a dry run) first; Apply runs it.
$("b-promote").onclick = () => act("promote plan", async () => {
  const plan = await api("POST", `/sandboxes/${encodeURIComponent(selected)}/promote`, { dry_run: true });
  $("plan-list").replaceChildren(...plan.changes.map((c) => el("li", { class: "kind-" + c.kind }, `${c.kind} ${c.path}`)));
  const problems = [...(plan.conflicts || []), ...(plan.refused || [])];
  $("plan-note").textContent = problems.length ? "Blocked: " + problems.map((p) => `${p.path}: ${p.reason}`).join("; ") :
    `${plan.changes.length} change(s) to apply to the host directory.`;
  $("b-apply").disabled = problems.length > 0 || plan.changes.length === 0;
  $("plan").hidden = false;
});
$("b-apply").onclick = () => act("promote", async () => {
  await api("POST", `/sandboxes/${encodeURIComponent(selected)}/promote`, {});
  $("plan").hidden = true;
});
$("b-cancel").onclick = () => { $("plan").hidden = true; };

refresh();
setInterval(refresh, 1000);

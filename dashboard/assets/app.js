// tine dashboard: polls the /v1 API and renders the fork tree and the
// selected sandbox. No framework, no build step.
"use strict";

let selected = null;
const $ = (id) => document.getElementById(id);

async function api(method, path, body) {
  const opts = { method, headers: {} };
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
  return ct.includes("json") ? res.json() : res.text();
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

// renderTree draws sandboxes nested under the one each was forked from.
function renderTree(list) {
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
    const label = el("span", { class: "node" + (s.name === selected ? " selected" : ""), "data-name": s.name },
      s.name, el("span", { class: "state " + s.state }, s.state),
      el("span", { class: "usage" }, `${s.processes} proc · ${s.ports} ports · ${bytes(s.project_bytes)}`));
    label.onclick = () => { selected = s.name; refresh(); };
    const li = el("li", { "data-sandbox": s.name }, label);
    const ch = kids.get(s.name);
    if (ch) li.append(el("ul", {}, ...ch.map(node)));
    return li;
  };
  $("tree").replaceChildren(...roots.map(node));
  $("empty").hidden = list.length > 0;
}

async function renderDetail(sb) {
  $("detail").hidden = !sb;
  if (!sb) return;
  $("d-name").textContent = sb.name;
  $("d-info").textContent = `${sb.state} · from ${sb.from}` + (sb.forked_from ? ` · fork of ${sb.forked_from}` : "") +
    ` · project at ${sb.project_path}` + (sb.limits && sb.limits.pids ? ` · pids ≤ ${sb.limits.pids}` : "") +
    (sb.limits && sb.limits.project_bytes ? ` · disk ≤ ${bytes(sb.limits.project_bytes)}` : "");
  const name = encodeURIComponent(sb.name);
  const running = sb.state === "running";
  const [ps, ports, diff, snaps, logs] = await Promise.all([
    running ? api("GET", `/sandboxes/${name}/ps`).catch(() => []) : [],
    running ? api("GET", `/sandboxes/${name}/ports`).catch(() => []) : [],
    api("GET", `/sandboxes/${name}/diff`).catch(() => []),
    api("GET", `/sandboxes/${name}/snapshots`).catch(() => []),
    api("GET", `/sandboxes/${name}/logs?tail=100`).catch(() => ""),
  ]);
  $("ps").replaceChildren(...ps.map((p) => el("tr", {}, el("td", {}, String(p.pid)), el("td", {}, p.user || String(p.uid)),
    el("td", {}, p.state), el("td", {}, (p.argv && p.argv.length ? p.argv.join(" ") : `[${p.comm}]`)))));
  $("ports").replaceChildren(...ports.map((p) => el("li", {}, `${p.proto} ${p.address}:${p.port}` + (p.pid ? ` (pid ${p.pid})` : ""))));
  $("diff").replaceChildren(...(diff.length ? diff.map((c) => el("li", { class: "kind-" + c.kind }, `${c.kind} ${c.path}`)) : [el("li", {}, "no changes")]));
  $("snaps").replaceChildren(...snaps.map((s) => el("li", {}, `${s.id}` + (s.name ? ` (${s.name})` : "") + ` ${s.created}`)));
  $("logs").textContent = logs || "(no service output)";
}

async function refresh() {
  try {
    const list = await api("GET", "/sandboxes");
    if (selected && !list.some((s) => s.name === selected)) selected = null;
    renderTree(list);
    await renderDetail(list.find((s) => s.name === selected));
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

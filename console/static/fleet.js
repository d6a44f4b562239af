// The fleet view: every 3 s it reads this node's JSON routes (overview,
// stats, health, workers, Raft members) and redraws hosts, members,
// plugins, instances and charts; actions go through the same routes the
// CLI uses, each confirmed, and the answer is shown.
import { api, el, banner, say, report, confirmAction, setupLogin, ago, bytes, instanceURL, scope, setScope, PREFIX } from "./common.js";
import { chart, sumAligned } from "./chart.js";

const POLL_MS = 3000;
const HISTORY = 100; // polls of per-node RSS and CPU kept in the page

const view = (() => {
  const p = location.pathname.replace(/\/+$/, "");
  if (p.endsWith("/fleet/hosts")) return "hosts";
  if (p.endsWith("/fleet/instances")) return "instances";
  return "fleet";
})();

let self = null; // this node's /_pinned/status: which node serves the console
let last = null; // the latest reading
const usage = new Map(); // node id -> {rss: [], cpu: []}
let timer = null;
let busy = false;
let again = false; // a reading was asked for while one was under way
let bound = new Map(); // hostname-aware mode: hostname -> env, from the workers' routes

for (const s of document.querySelectorAll("[data-views]")) s.hidden = !s.dataset.views.split(" ").includes(view);
for (const a of document.querySelectorAll("nav a[data-view]")) {
  if (a.dataset.view === view) a.setAttribute("aria-current", "page");
}
setupLogin(() => {
  self = null;
  refresh();
});
document.getElementById("scope-hostname").addEventListener("change", (ev) => {
  setScope(ev.target.value, bound.get(ev.target.value) ?? null);
  if (last) draw(last);
});
document.getElementById("drawer-close").addEventListener("click", () => setInspect(null));
document.addEventListener("keydown", (ev) => {
  if (ev.key === "Escape" && !document.getElementById("drawer").hidden && !document.getElementById("confirm").open) setInspect(null);
});
window.addEventListener("popstate", () => drawDrawer());
document.addEventListener("visibilitychange", () => {
  if (!document.hidden) refresh();
});
refresh();

// refresh reads everything once and redraws, then schedules the next
// reading (a hidden tab stops polling until it is shown again).
async function refresh() {
  clearTimeout(timer);
  if (busy) {
    // An action's result must show: read again once this reading ends.
    again = true;
    return;
  }
  busy = true;
  try {
    await read();
  } finally {
    busy = false;
    if (!document.hidden) timer = setTimeout(refresh, again ? 0 : POLL_MS);
    again = false;
  }
}

async function read() {
  if (!self) {
    try {
      self = await api("GET", "/_pinned/status");
    } catch (err) {
      self = null;
      banner(err.message);
      say(err.status === 401 ? "Waiting for a token." : "Could not read this node's status.");
      return;
    }
  }
  const names = ["overview", "stats", "health", "workers", "members"];
  const got = await Promise.allSettled([
    api("GET", "/registry/overview"),
    api("GET", "/registry/stats"),
    api("GET", "/registry/health"),
    api("GET", "/registry/workers"),
    api("GET", "/_raft/members"),
  ]);
  const r = {};
  const failed = [];
  got.forEach((g, i) => {
    if (g.status === "fulfilled") r[names[i]] = g.value;
    else failed.push(`${names[i]}: ${g.reason.message}`);
  });
  if (failed.length === names.length) {
    banner(got[0].reason.message);
    say("The fleet could not be read; showing the last reading" + (last ? ` from ${new Date(last.at).toLocaleTimeString()}.` : "."));
    return;
  }
  banner(failed.length ? "Part of the fleet could not be read. " + failed.join(" ") : "");
  last = { at: Date.now(), ...mergeLast(r) };
  track(last);
  draw(last);
  say(`${self.nodeId ?? "this node"}: fleet of ${last.hosts.length} host(s), ${last.instances.length} instance(s).`);
  document.getElementById("updated").textContent = `Updated ${new Date(last.at).toLocaleTimeString()} (every ${POLL_MS / 1000} s).`;
}

// mergeLast keeps what a failed route would have said from the reading
// before, so one slow route does not blank a table.
function mergeLast(r) {
  const prev = last ?? {};
  const overview = r.overview ?? prev.overview ?? {};
  const stats = r.stats?.workers ?? prev.stats ?? [];
  const health = r.health ?? prev.health ?? {};
  const workers = r.workers?.workers ?? prev.workers ?? [];
  const members = r.members ?? prev.members ?? [];
  const byClient = new Map(stats.map((s) => [s.clientId, s]));
  const hosts = workers.map((w) => ({ ...w, stats: byClient.get(w.clientId) ?? null }));
  hosts.sort((a, b) => a.nodeId.localeCompare(b.nodeId));
  const instances = [];
  for (const s of stats) {
    for (const i of s.instances ?? []) instances.push({ ...i, nodeId: s.nodeId, clientId: s.clientId });
  }
  instances.sort((a, b) => (a.namespace + "/" + a.id).localeCompare(b.namespace + "/" + b.id));
  return { overview, stats, health, workers, members, hosts, instances };
}

function track(r) {
  for (const s of r.stats) {
    if (s.error || !s.nodeId) continue;
    const u = usage.get(s.nodeId) ?? { rss: [], cpu: [] };
    u.rss.push((s.rssBytes ?? 0) / 1048576);
    u.cpu.push(s.cpuPercent ?? 0);
    if (u.rss.length > HISTORY) u.rss.shift(), u.cpu.shift();
    usage.set(s.nodeId, u);
  }
}

function draw(r) {
  // Rows are rebuilt on each reading: keep the keyboard where it was.
  const focused = document.activeElement?.getAttribute?.("aria-label");
  drawTables(r);
  if (focused && !document.activeElement?.isConnected) {
    document.querySelector(`[aria-label="${CSS.escape(focused)}"]`)?.focus();
  }
}

function drawTables(r) {
  drawSummary(r);
  drawCharts(r);
  const v = scoped(r);
  drawHosts(v);
  drawMembers(r);
  drawPlugins(v);
  drawInstances(v);
  drawDrawer();
}

// scoped is r as the hostname selector shows it: in hostname-aware mode,
// with a hostname chosen, only the hosts serving it, its plugins and its
// instances. It offers the hostnames the workers' routes bind, and hides
// itself in single mode.
function scoped(r) {
  bound = new Map();
  for (const h of r.hosts) {
    for (const rt of h.routes ?? []) if (!rt.superseded) bound.set(rt.hostname, rt.env);
  }
  const names = [...bound.keys()].sort();
  const sel = document.getElementById("scope-hostname");
  document.getElementById("scope").hidden = names.length === 0;
  if (scope.hostname && !bound.has(scope.hostname)) setScope(null);
  else if (scope.hostname) scope.env = bound.get(scope.hostname);
  const want = ["", ...names];
  if ([...sel.options].map((o) => o.value).join("\n") !== want.join("\n")) {
    sel.replaceChildren(...want.map((n) => el("option", { value: n }, n || "All hostnames")));
  }
  sel.value = scope.hostname ?? "";
  const h = scope.hostname;
  if (!h) return r;
  return {
    ...r,
    hosts: r.hosts.filter((x) => (x.routes ?? []).some((rt) => rt.hostname === h)),
    stats: r.stats.map((s) => ({ ...s, plugins: (s.plugins ?? []).filter((p) => p.hostname === h) })),
    instances: r.instances.filter((i) => i.hostname === h),
  };
}

function card(term, value, id) {
  return [el("div", { class: "card" }, el("dt", {}, term), el("dd", id ? { id } : {}, String(value)))];
}

function drawSummary(r) {
  const w = r.overview.workers ?? {};
  const windingDown = r.hosts.filter((h) => h.draining && !h.cordoned).length;
  const conns = r.instances.reduce((n, i) => n + (i.connections ?? 0), 0);
  const clientConns = r.stats.reduce((n, s) => n + (s.series?.connections ?? 0), 0);
  const leader = r.members.find((m) => m.leader);
  const q = r.health.quarantineMs ?? r.overview.quarantineMs ?? 0;
  document.getElementById("summary").replaceChildren(
    ...card("Hosts live", `${w.live ?? r.hosts.length} of ${w.registered ?? r.hosts.length}`, "count-hosts"),
    ...card("Instances", r.instances.length, "count-instances"),
    ...card("Instance connections", conns, "count-connections"),
    ...card("Client connections", clientConns),
    ...card("Placements", r.overview.placements ?? "-"),
    ...card("Hosts draining", w.draining ?? 0, "count-draining"),
    ...card("Hosts winding down", windingDown),
    ...card("Instances winding down", r.instances.filter((i) => i.deadlineMs).length),
    ...card("Hosts degraded", w.degraded ?? 0),
    ...card("Raft leader", leader ? `${leader.id} (term ${r.health.term ?? "?"})` : "none known"),
    ...card("Quarantine", q > 0 ? `${Math.ceil(q / 1000)} s left` : "over"),
  );
  const res = {};
  for (const s of r.stats) for (const [k, v] of Object.entries(s.series?.resolutions ?? {})) res[k] = (res[k] ?? 0) + v;
  const order = ["local", "forwarded", "placed", "quarantined", "no-backends", "starting", "error"];
  const keys = [...order.filter((k) => k in res), ...Object.keys(res).filter((k) => !order.includes(k)).sort()];
  document.getElementById("resolutions").replaceChildren(...keys.flatMap((k) => card(k, res[k])));
}

function drawCharts(r) {
  const series = r.stats.map((s) => s.series).filter(Boolean);
  const step = series[0]?.intervalMs ?? 5000;
  const perSec = (v) => `${v.toFixed(1)}/s`;
  const count = (v) => `${Math.round(v)}`;
  const rate = (col) => sumAligned(series.map((s) => s[col] ?? [])).map((v) => v / (step / 1000));
  const sum = (col) => sumAligned(series.map((s) => s[col] ?? []));
  document.getElementById("charts").replaceChildren(
    chart("Requests served", rate("requests"), { stepMs: step, format: perSec }),
    chart("Activations", sum("activations"), { stepMs: step, format: count }),
    chart("Placements", sum("placements"), { stepMs: step, format: count }),
    chart("Forward failures", sum("forwardFailures"), { stepMs: step, format: count }),
  );
  const nodes = [...usage.keys()].sort();
  document.getElementById("node-charts").replaceChildren(
    ...nodes.flatMap((n) => [
      chart(`${n} RSS`, usage.get(n).rss, { stepMs: POLL_MS, format: (v) => `${v.toFixed(1)} MiB` }),
      chart(`${n} CPU`, usage.get(n).cpu, { stepMs: POLL_MS, format: (v) => `${v.toFixed(1)} %` }),
    ]),
  );
}

function hostState(h) {
  const parts = [];
  parts.push(h.live ? `lease ${ago(h.expiresInMs)} left` : "lease lapsed");
  if (h.draining) {
    const how = h.cordoned ? "cordoned" : h.drainDeadline ? `draining, deadline in ${ago(h.drainDeadline - Date.now())}` : "draining";
    parts.push(`${how} (${(h.drainSources ?? []).join(", ")})`);
  }
  if (h.degraded) parts.push("degraded");
  if (h.stats?.error) parts.push(`stats: ${h.stats.error}`);
  return parts.join("; ");
}

// served is what a host serves: its namespaces, or in hostname-aware mode
// its routes with the env each one's ids live in.
function served(h) {
  const routes = (h.routes ?? []).map((rt) => `${rt.hostname}${rt.namespace} (env ${rt.env})${rt.superseded ? " superseded" : ""}`);
  return [...(h.namespaces ?? []), ...routes].join(", ");
}

function drawHosts(r) {
  const rows = r.hosts.map((h) => {
    const s = h.stats ?? {};
    const name = h.nodeId;
    return el("tr", { "data-node": name },
      el("th", { scope: "row" }, el("a", { href: inspectHref(`host:${name}`), "data-inspect": `host:${name}` }, name), self?.nodeId === name ? " (this node)" : ""),
      el("td", { class: "state" }, hostState(h)),
      el("td", {}, served(h)),
      el("td", {}, (s.instances ?? []).length),
      el("td", {}, h.placements ?? 0),
      el("td", {}, bytes(s.rssBytes)),
      el("td", {}, s.cpuPercent != null ? `${s.cpuPercent.toFixed(1)} %` : "-"),
      el("td", { class: "actions" }, hostActions(h)),
    );
  });
  tbody("hosts", rows, "No live hosts.", 8);
}

function hostActions(h) {
  const n = h.nodeId;
  const drain = (label, secs) =>
    el("button", { type: "button", "aria-label": `${label} ${n}`, onclick: () => act(
      `Force drain ${n} with a deadline of ${label.replace("Drain ", "")}? It takes no new placements, its idle instances go at once, the rest at the deadline; it stays drained until Undrain.`,
      () => api("POST", "/registry/drain", { nodeId: n, deadline: secs }),
      (out) => `${n}: draining, deadline ${new Date(out.deadline).toLocaleTimeString()}.`) }, label);
  return [
    el("button", { type: "button", "aria-label": `Cordon ${n}`, onclick: () => act(
      `Cordon ${n}? It takes no new placements; its running instances stay until Undrain (no deadline).`,
      () => api("POST", "/registry/drain", { nodeId: n, deadline: null }),
      () => `${n}: cordoned.`) }, "Cordon"),
    drain("Drain 30 s", 30),
    drain("Drain 5 min", 300),
    drain("Drain 30 min", 1800),
    el("button", { type: "button", "aria-label": `Undrain ${n}`, onclick: () => act(
      `Undrain ${n}? It takes new placements again.`,
      () => api("POST", "/registry/undrain", { nodeId: n }),
      () => `${n}: undrained.`) }, "Undrain"),
  ];
}

function drawMembers(r) {
  const rows = r.members.map((m) =>
    el("tr", {},
      el("th", { scope: "row" }, m.id),
      el("td", {}, m.raft_addr),
      el("td", {}, m.voter ? "voter" : "nonvoter"),
      el("td", {}, m.leader ? "leader" : ""),
      el("td", {}, m.last_contact ? `${ago(Date.now() - Date.parse(m.last_contact))} ago` : "-"),
    ));
  tbody("members", rows, "No members known.", 5);
}

function drawPlugins(r) {
  const rows = [];
  for (const s of [...r.stats].sort((a, b) => (a.nodeId ?? "").localeCompare(b.nodeId ?? ""))) {
    for (const p of s.plugins ?? []) {
      const here = self?.nodeId === s.nodeId;
      // A plugin is named by its route: "/ns", or "host/ns" in
      // hostname-aware mode.
      const ns = (p.namespaces ?? [])[0] && (p.hostname ?? "") + p.namespaces[0];
      let action;
      if (here && ns) {
        action = el("button", { type: "button", "aria-label": `Reload ${p.name} on ${s.nodeId}`, onclick: () => act(
          `Reload (hot swap) ${p.name} on ${s.nodeId}? A new process starts, new activations go to it, the old one's instances wind down and come back in the new one.`,
          () => api("POST", "/_pinned/plugins/reload", { namespace: ns }),
          () => `${p.name} on ${s.nodeId}: reloaded.`) }, "Reload");
      } else if (consoleOf(s.advertiseUrl)) {
        // A reload acts on the node it is sent to; the console calls only
        // its own origin, so another node's reload is on its own console.
        action = el("a", { href: consoleOf(s.advertiseUrl) }, `Reload from ${s.nodeId}'s console`);
      }
      rows.push(el("tr", { "data-node": s.nodeId, "data-plugin": p.name },
        el("th", { scope: "row" }, s.nodeId),
        el("td", {}, p.name),
        el("td", {}, (p.namespaces ?? []).map((n) => (p.hostname ?? "") + n).join(", ") + (p.env ? ` (env ${p.env})` : "")),
        el("td", { class: "state" }, p.state + (p.degraded ? " (degraded)" : "") + (p.lastError ? `: ${p.lastError}` : "")),
        el("td", { class: "mono" }, p.version ?? "-"),
        el("td", {}, p.incarnation),
        el("td", {}, p.restarts),
        el("td", { class: "actions" }, action),
      ));
    }
  }
  tbody("plugins", rows, "No plugins (nodes with --no-hosts run none).", 8);
}

// consoleOf is the hosts page of the console at a node's advertised URL,
// or null for anything but an http(s) URL.
function consoleOf(advertiseUrl) {
  try {
    const u = new URL(PREFIX + "fleet/hosts", advertiseUrl);
    return u.protocol === "http:" || u.protocol === "https:" ? u.href : null;
  } catch {
    return null;
  }
}

function drawInstances(r) {
  const rows = r.instances.map((i) => {
    const name = instanceURL(i.namespace, i.id);
    return el("tr", { "data-instance": name },
      el("th", { scope: "row" }, el("a", { href: inspectHref(`instance:${name}`), "data-inspect": `instance:${name}` }, name)),
      el("td", {}, i.nodeId),
      el("td", {}, i.generation),
      el("td", {}, i.connections),
      el("td", { class: "state" }, instanceState(i)),
      el("td", {}, i.tasks),
      el("td", { class: "actions" }, instanceActions(i)),
    );
  });
  tbody("instances", rows, "No live instances.", 7);
}

function instanceState(i) {
  const use = i.connections ? `busy (${i.connections} open)` : `idle ${ago(i.idleMs)}`;
  return i.deadlineMs ? `${use}; winding down, goes in ${ago(Math.max(0, i.deadlineMs - Date.now()))}` : use;
}

function instanceActions(i) {
  const name = instanceURL(i.namespace, i.id);
  const windDown = (deadline) => {
    const body = { namespace: i.namespace, id: i.id, deadline };
    const env = i.env || scope.env; // hostname-aware mode: the instance's own env
    if (env) body.env = env;
    return api("POST", "/registry/wind_down", body);
  };
  const result = (out, what) => {
    const failed = out.failed?.length ? ` Some owners failed: ${out.failed.join("; ")}` : "";
    return `${name}: ${what} on ${out.instances} instance(s).${failed}`;
  };
  return [
    el("button", { type: "button", "aria-label": `Wind down ${name}`, onclick: () => act(
      `Wind down ${name} now (deadline 0)? It is evicted as soon as its work allows; its next request activates it again.`,
      () => windDown(0), (out) => result(out, "wind-down")) }, "Wind down"),
    el("button", { type: "button", "aria-label": `Cancel wind-down of ${name}`, onclick: () => act(
      `Cancel the wind-down of ${name}?`,
      () => windDown(null), (out) => result(out, "wind-down cancelled")) }, "Cancel wind-down"),
    el("a", { href: `${PREFIX}inspector?url=${encodeURIComponent(name)}`, "aria-label": `Inspect ${name}` }, "Inspect"),
  ];
}

function tbody(id, rows, empty, cols) {
  const b = document.querySelector(`#${id} tbody`);
  b.replaceChildren(...(rows.length ? rows : [el("tr", {}, el("td", { colspan: cols, class: "muted" }, empty))]));
}

// act confirms, calls, shows the answer, and reads the fleet again so the
// resulting state shows.
async function act(question, call, describe) {
  if (!(await confirmAction(question))) {
    report("Cancelled.");
    return;
  }
  try {
    const out = await call();
    report(describe(out ?? {}));
  } catch (err) {
    // In the action's line, not the banner: the next reading clears that.
    report("The action failed: " + err.message, true);
  }
  await refresh();
}

// The drawer: ?inspect=host:<node> or ?inspect=instance:/<ns>/<id>.
function inspectHref(what) {
  const u = new URL(location.href);
  u.searchParams.set("inspect", what);
  return u.pathname + u.search;
}

function setInspect(what) {
  const u = new URL(location.href);
  if (what) u.searchParams.set("inspect", what);
  else u.searchParams.delete("inspect");
  history.pushState(null, "", u.pathname + u.search);
  drawDrawer();
}

document.addEventListener("click", (ev) => {
  const a = ev.target.closest?.("a[data-inspect]");
  if (!a || ev.ctrlKey || ev.metaKey || ev.shiftKey) return;
  ev.preventDefault();
  setInspect(a.dataset.inspect);
});

function drawDrawer() {
  const what = new URL(location.href).searchParams.get("inspect");
  const d = document.getElementById("drawer");
  const body = document.getElementById("drawer-body");
  if (!what) {
    d.hidden = true;
    return;
  }
  const wasHidden = d.hidden;
  d.hidden = false;
  const [kind, ...rest] = what.split(":");
  const key = rest.join(":");
  const h = document.getElementById("drawer-h");
  if (!last) {
    h.textContent = key;
    body.replaceChildren(el("p", {}, "Loading…"));
    return;
  }
  if (kind === "host") {
    h.textContent = `Host ${key}`;
    const host = last.hosts.find((x) => x.nodeId === key);
    if (!host) {
      body.replaceChildren(el("p", {}, `No live host ${key} now: it may have left or its lease lapsed.`));
    } else {
      const s = host.stats ?? {};
      body.replaceChildren(
        dl([
          ["State", hostState(host)], ["Client id", host.clientId], ["URL", host.advertiseUrl],
          ["Namespaces", served(host)], ["Headroom", host.headroom], ["Placements", host.placements],
          ["Uptime", ago(s.uptimeMs)], ["RSS", bytes(s.rssBytes)], ["CPU", s.cpuPercent != null ? `${s.cpuPercent.toFixed(1)} %` : "-"],
          ["Lease flaps", s.leaseFlaps ?? "-"], ["Re-registrations", s.reregistrations ?? "-"],
          ["Instances", (s.instances ?? []).map((i) => instanceURL(i.namespace, i.id)).join(", ") || "none"],
        ]),
        el("div", { class: "actions" }, hostActions(host)),
      );
    }
  } else if (kind === "instance") {
    h.textContent = `Instance ${key}`;
    const inst = last.instances.find((i) => instanceURL(i.namespace, i.id) === key);
    if (!inst) {
      body.replaceChildren(el("p", {}, `${key} is not active on any node now (evicted, or never activated). Its next request activates it.`),
        el("a", { href: `${PREFIX}inspector?url=${encodeURIComponent(key)}` }, "Inspect it (attaching activates it)"));
    } else {
      body.replaceChildren(
        dl([
          ["Node", inst.nodeId], ["Generation", inst.generation], ["Plugin", `${inst.plugin} (pid ${inst.pid})`],
          ["Connections", inst.connections], ["State", instanceState(inst)], ["Tasks", inst.tasks],
          ["Activated", new Date(inst.activatedAt).toLocaleString()],
        ]),
        el("div", { class: "actions" }, instanceActions(inst)),
      );
    }
  } else {
    h.textContent = "Details";
    body.replaceChildren(el("p", {}, `?inspect= takes host:<node id> or instance:/<namespace>/<id>, not ${what}.`));
  }
  if (wasHidden) document.getElementById("drawer-close").focus();
}

function dl(pairs) {
  return el("dl", { class: "kv" }, pairs.flatMap(([k, v]) => [el("dt", {}, k), el("dd", {}, v == null ? "-" : String(v))]));
}

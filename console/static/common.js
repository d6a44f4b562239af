// What every console page shares: the operator's token (sessionStorage),
// calls to this node's JSON routes with it, errors in words, a confirm
// dialog, and DOM building that never parses data as HTML.

export const PREFIX = "/_pinned/console/";
const TOKEN_KEY = "pinnedd.console.token";

export function token() {
  return sessionStorage.getItem(TOKEN_KEY) ?? "";
}

export function authHeaders() {
  const t = token();
  return t ? { authorization: "Bearer " + t } : {};
}

// Hostname-aware mode: the views are scoped to one hostname (null: all of
// them), kept in localStorage and reset when a token is entered (a new
// connection); env is the env that hostname is bound to, which a
// wind-down sends when the instance does not say.
const SCOPE_KEY = "pinnedd.console.hostname";
export const scope = { hostname: localStorage.getItem(SCOPE_KEY) || null, env: null };

export function setScope(hostname, env = null) {
  scope.hostname = hostname || null;
  scope.env = scope.hostname ? env : null;
  if (scope.hostname) localStorage.setItem(SCOPE_KEY, scope.hostname);
  else localStorage.removeItem(SCOPE_KEY);
}

// ApiError is a refused or failed call, with what to tell the operator.
export class ApiError extends Error {
  constructor(status, message, body) {
    super(message);
    this.status = status;
    this.body = body;
  }
}

// api calls one of this node's routes with the operator's token and
// returns the JSON answer; anything but a 2xx throws an ApiError whose
// message says in words what happened.
export async function api(method, path, body) {
  const init = { method, headers: { ...authHeaders() }, cache: "no-store" };
  if (body !== undefined) {
    init.headers["content-type"] = "application/json";
    init.body = JSON.stringify(body);
  }
  let res;
  try {
    res = await fetch(path, init);
  } catch (err) {
    throw new ApiError(0, `This node did not answer (${path}): it may have stopped or be restarting. The console keeps trying.`);
  }
  const text = await res.text();
  let json = null;
  try {
    json = text ? JSON.parse(text) : null;
  } catch {}
  if (res.ok) return json;
  const said = json?.error ?? text.trim() ?? res.statusText;
  switch (res.status) {
    case 401:
      throw new ApiError(401, `The token was refused (401): ${said}. Enter a valid operator token above.`, json);
    case 403:
      throw new ApiError(403, `This token may not do that (403): ${said}.`, json);
    case 404:
      throw new ApiError(404, `Not found (404): ${said}.`, json);
    case 503: {
      const ra = res.headers.get("retry-after");
      throw new ApiError(503, `Unavailable (503): ${said}${ra ? `; retry in ${ra} s` : ""}.`, json);
    }
  }
  throw new ApiError(res.status, `The node answered ${res.status}: ${said}.`, json);
}

// el builds an element: attrs are attributes (on* are listeners), children
// strings (text) or nodes. Data only ever becomes text.
export function el(tag, attrs = {}, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (v === undefined || v === null || v === false) continue;
    if (k.startsWith("on")) e.addEventListener(k.slice(2), v);
    else e.setAttribute(k, v === true ? "" : String(v));
  }
  for (const c of children.flat()) {
    if (c === undefined || c === null) continue;
    e.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return e;
}

export function banner(message) {
  const b = document.getElementById("banner");
  b.textContent = message ?? "";
  b.hidden = !message;
}

export function say(message) {
  document.getElementById("status").textContent = message;
}

// report says what an action did, apart from the polling's status line.
export function report(message, failed = false) {
  const r = document.getElementById("result");
  r.textContent = message;
  r.classList.toggle("failed", failed);
}

// confirmAction asks with the page's <dialog>; resolves true on Confirm.
export function confirmAction(question) {
  const d = document.getElementById("confirm");
  document.getElementById("confirm-text").textContent = question;
  return new Promise((resolve) => {
    d.addEventListener("close", () => resolve(d.returnValue === "ok"), { once: true });
    d.returnValue = "cancel";
    d.showModal();
    document.getElementById("confirm-cancel").focus();
  });
}

// setupLogin wires the token form of the header; onChange runs when the
// token is saved or forgotten.
export function setupLogin(onChange) {
  const form = document.getElementById("login");
  const input = document.getElementById("token");
  const state = document.getElementById("token-state");
  const show = () => {
    state.textContent = token() ? "token set for this tab" : "no token (a --dev node takes calls from this machine without one)";
  };
  form.addEventListener("submit", (ev) => {
    ev.preventDefault();
    const v = input.value.trim();
    if (v) sessionStorage.setItem(TOKEN_KEY, v);
    setScope(null); // a new connection starts with every hostname
    input.value = "";
    show();
    onChange();
  });
  document.getElementById("forget").addEventListener("click", () => {
    sessionStorage.removeItem(TOKEN_KEY);
    show();
    onChange();
  });
  show();
}

export function ago(ms) {
  if (ms == null || !Number.isFinite(ms)) return "-";
  if (ms < 1000) return `${Math.round(ms)} ms`;
  if (ms < 120000) return `${Math.round(ms / 1000)} s`;
  if (ms < 7200000) return `${Math.round(ms / 60000)} min`;
  return `${Math.round(ms / 3600000)} h`;
}

export function bytes(n) {
  if (!Number.isFinite(n)) return "-";
  const u = ["B", "KiB", "MiB", "GiB"];
  let i = 0;
  while (n >= 1024 && i < u.length - 1) {
    n /= 1024;
    i++;
  }
  return `${n.toFixed(i ? 1 : 0)} ${u[i]}`;
}

// instanceURL is the path of an instance: /<ns>/<id>, the id encoded.
export function instanceURL(ns, id) {
  return ns + "/" + encodeURIComponent(id);
}

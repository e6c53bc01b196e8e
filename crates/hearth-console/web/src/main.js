// Hearth's console: one page, hash routes, Preact components written with
// htm (tagged templates: no compile step of their own). Everything it
// shows and does goes through the public API with the signed-in key, so
// that key's workspace and permissions apply.

import { h, render } from "preact";
import { useEffect, useRef, useState, useCallback } from "preact/hooks";
import htm from "htm";
import { api, boxes, enc, onSignedOut, session } from "./api.js";
import { openTerminal } from "./terminal.js";
import { Usage } from "./charts.js";

const html = htm.bind(h);
const GiB = 1024 ** 3;
const MiB = 1024 ** 2;
const STATUSES = ["provisioning", "ready", "stopping", "stopped", "failed", "deleting"];

// ---------------------------------------------------------------------------
// Small helpers

function useRoute() {
  const [hash, setHash] = useState(location.hash || "#/");
  useEffect(() => {
    const f = () => setHash(location.hash || "#/");
    addEventListener("hashchange", f);
    return () => removeEventListener("hashchange", f);
  }, []);
  return hash.slice(1);
}

/** Calls `load` now and every `ms` while mounted; returns [data, error, reload]. */
function usePoll(load, ms, deps) {
  const [data, setData] = useState(null);
  const [error, setError] = useState(null);
  const [tick, setTick] = useState(0);
  useEffect(() => {
    let live = true;
    let timer = null;
    const run = async () => {
      try {
        const d = await load();
        if (live) {
          setData(d);
          setError(null);
        }
      } catch (e) {
        if (live) setError(e.message);
      }
      if (live && ms) timer = setTimeout(run, ms);
    };
    run();
    return () => {
      live = false;
      clearTimeout(timer);
    };
  }, [...deps, tick]);
  return [data, error, () => setTick((t) => t + 1)];
}

function since(iso) {
  if (!iso) return "";
  const s = Math.max(0, (Date.now() - Date.parse(iso)) / 1000);
  if (s < 60) return `${Math.floor(s)} s`;
  if (s < 3600) return `${Math.floor(s / 60)} min`;
  if (s < 86400) return `${Math.floor(s / 3600)} h`;
  return `${Math.floor(s / 86400)} d`;
}

function bytes(n) {
  if (n == null) return "";
  if (n >= GiB) return `${+(n / GiB).toFixed(1)} GiB`;
  if (n >= 1024 ** 2) return `${+(n / 1024 ** 2).toFixed(1)} MiB`;
  if (n >= 1024) return `${+(n / 1024).toFixed(1)} KiB`;
  return `${n} B`;
}

function Status({ status }) {
  return html`<span class=${`status status-${status}`}>${status}</span>`;
}

function Alert({ error }) {
  if (!error) return null;
  return html`<p class="alert" role="alert">${error}</p>`;
}

/** Runs an action, reporting its error; returns [run, busy, error]. */
function useAction() {
  const [busy, setBusy] = useState(false);
  const [error, setError] = useState(null);
  const run = async (f) => {
    setBusy(true);
    setError(null);
    try {
      return await f();
    } catch (e) {
      setError(e.message);
      return undefined;
    } finally {
      setBusy(false);
    }
  };
  return [run, busy, error];
}

// ---------------------------------------------------------------------------
// Sign-in

function SignIn({ notice, onSignIn }) {
  const [key, setKey] = useState("");
  const [run, busy, error] = useAction();
  const submit = (e) => {
    e.preventDefault();
    run(async () => {
      try {
        await api("GET", `${boxes}?page_size=1`, { key: key.trim() });
      } catch (err) {
        // 403: a real key without sandbox permissions (an operator's
        // fleet:read key); only 401 means the key itself is refused.
        if (err.status !== 403) throw err;
      }
      session.signIn(key.trim());
      onSignIn();
    });
  };
  return html`<main class="signin">
    <h1>Hearth</h1>
    <form onSubmit=${submit} aria-labelledby="signin-title">
      <h2 id="signin-title">Sign in</h2>
      ${notice && html`<p class="notice" role="status">${notice}</p>`}
      <label for="api-key">API key</label>
      <input id="api-key" name="api-key" type="password" autocomplete="off"
        value=${key} onInput=${(e) => setKey(e.target.value)} required />
      <p class="hint">Kept in this browser tab only, until you sign out or close it.</p>
      <${Alert} error=${error && `Sign-in refused: ${error}`} />
      <button type="submit" disabled=${busy}>Sign in</button>
    </form>
  </main>`;
}

// ---------------------------------------------------------------------------
// Sandboxes

function SandboxList() {
  const [status, setStatus] = useState("");
  const [name, setName] = useState("");
  const [label, setLabel] = useState("");
  const [creating, setCreating] = useState(false);
  const query = () => {
    const q = new URLSearchParams({ page_size: "500" });
    if (status) q.set("status", status);
    if (name) q.set("name_contains", name);
    for (const l of label.split(",").map((s) => s.trim()).filter(Boolean)) q.append("label", l);
    return q.toString();
  };
  const [list, error, reload] = usePoll(() => api("GET", `${boxes}?${query()}`), 2000, [
    status,
    name,
    label,
  ]);
  const items = (list && list.items) || [];
  const snapshotName = useSnapshotNames();
  // Hosts are named only to keys holding fleet:read.
  const showHosts = items.some((b) => b.host_id);
  return html`<section aria-labelledby="sandboxes-title">
    <div class="heading">
      <h1 id="sandboxes-title">Sandboxes</h1>
      <button onClick=${() => setCreating(!creating)} aria-expanded=${creating}>
        ${creating ? "Close" : "New sandbox"}
      </button>
    </div>
    ${creating && html`<${CreateForm} onCreated=${() => { setCreating(false); reload(); }} />`}
    <form class="filters" role="search" onSubmit=${(e) => e.preventDefault()}>
      <label>Status
        <select value=${status} onChange=${(e) => setStatus(e.target.value)}>
          <option value="">any</option>
          ${STATUSES.map((s) => html`<option value=${s}>${s}</option>`)}
        </select>
      </label>
      <label>Name contains
        <input type="search" value=${name} onInput=${(e) => setName(e.target.value)} />
      </label>
      <label>Labels (key=value, …)
        <input type="search" value=${label} onInput=${(e) => setLabel(e.target.value)} />
      </label>
    </form>
    <${Alert} error=${error} />
    <div class="table-wrap">
      <table>
        <caption class="visually-hidden">Sandboxes, updated every two seconds</caption>
        <thead><tr>
          <th scope="col">Name</th><th scope="col">Status</th><th scope="col">Snapshot</th>
          <th scope="col">Size</th><th scope="col">Persistent</th><th scope="col">Labels</th>
          ${showHosts && html`<th scope="col">Host</th>`}
          <th scope="col">Age</th><th scope="col">Idle</th><th scope="col">Stopped</th>
        </tr></thead>
        <tbody>
          ${items.map((b) => html`<tr key=${b.id} data-name=${b.name}>
            <td><a href=${`#/sandboxes/${enc(b.name)}`}>${b.name}</a></td>
            <td><${Status} status=${b.status} /></td>
            <td class="box-snapshot">${snapshotName(b.snapshot_id)}</td>
            <td>${b.size_class}</td>
            <td>${b.persistent ? "yes" : "no"}</td>
            <td>${Object.entries(b.labels || {}).map(([k, v]) => html`<span class="tag">${k}=${v}</span> `)}</td>
            ${showHosts && html`<td class="box-host"><${HostId} id=${b.host_id} /></td>`}
            <td>${since(b.created_at)}</td>
            <td class="box-idle">${b.status === "ready" && b.last_activity_at ? since(b.last_activity_at) : ""}</td>
            <td>${b.stopped_at ? `${since(b.stopped_at)} ago` : ""}</td>
          </tr>`)}
        </tbody>
      </table>
      ${list && items.length === 0 && html`<p class="empty">No sandboxes${status || name || label ? " match" : " yet"}.</p>`}
    </div>
  </section>`;
}

// A snapshot's name by id (the workspace's and the built-in ones), read
// once a minute; the id itself until it is known.
function useSnapshotNames() {
  const [list] = usePoll(() => api("GET", "/api/v2/sandboxes/snapshots?page_size=200"), 60000, []);
  const names = new Map(((list && list.items) || []).map((s) => [s.id, s.name]));
  return (id) => (id ? names.get(id) || id : "default image");
}

function HostId({ id }) {
  return id ? html`<span title=${id}>${id.slice(0, 8)}</span>` : "";
}

// A sandbox's status history, oldest first, as the control plane recorded it.
// Read again as soon as the page sees the status change.
function History({ path, status }) {
  const [history, error] = usePoll(() => api("GET", `${path}/events`), 5000, [path, status]);
  const events = (history && history.events) || [];
  const hosts = events.some((e) => e.host_id);
  return html`<details class="card" open>
    <summary>Status history</summary>
    <${Alert} error=${error} />
    <div class="table-wrap">
      <table class="history">
        <caption class="visually-hidden">Status changes, oldest first</caption>
        <thead><tr><th scope="col">When</th><th scope="col">Status</th><th scope="col">Message</th>
          ${hosts && html`<th scope="col">Host</th>`}</tr></thead>
        <tbody>${events.map((e, i) => html`<tr key=${i} data-status=${e.status}>
          <td><time datetime=${e.at} title=${e.at}>${since(e.at)} ago</time></td>
          <td><${Status} status=${e.status} /></td>
          <td>${e.status_message || ""}</td>
          ${hosts && html`<td><${HostId} id=${e.host_id} /></td>`}
        </tr>`)}</tbody>
      </table>
    </div>
  </details>`;
}

function CreateForm({ onCreated }) {
  const [snapshots] = usePoll(() => api("GET", "/api/v2/sandboxes/snapshots?page_size=200"), 0, []);
  const [run, busy, error] = useAction();
  const submit = (e) => {
    e.preventDefault();
    const f = new FormData(e.target);
    const body = { wait_for_ready: false };
    const text = (k) => String(f.get(k) || "").trim();
    if (text("name")) body.name = text("name");
    if (text("snapshot")) body.snapshot_name = text("snapshot");
    if (text("vcpus")) body.vcpus = Number(text("vcpus"));
    if (text("mem")) body.mem_bytes = Math.round(Number(text("mem")) * GiB);
    if (text("disk")) body.fs_capacity_bytes = Math.round(Number(text("disk")) * GiB);
    if (text("idle")) body.idle_ttl_seconds = Number(text("idle"));
    if (text("after")) body.delete_after_stop_seconds = Number(text("after"));
    body.persistent = f.get("persistent") === "on";
    const labels = {};
    for (const pair of text("labels").split(",").map((s) => s.trim()).filter(Boolean)) {
      const [k, ...v] = pair.split("=");
      labels[k.trim()] = v.join("=").trim();
    }
    if (Object.keys(labels).length) body.labels = labels;
    run(async () => {
      await api("POST", boxes, { body });
      onCreated();
    });
  };
  const names = [...new Set(((snapshots && snapshots.items) || []).map((s) => s.name))];
  return html`<form class="card create" onSubmit=${submit} aria-label="New sandbox">
    <div class="grid">
      <label>Name <input name="name" placeholder="generated" /></label>
      <label>Snapshot
        <select name="snapshot">
          <option value="">default image</option>
          ${names.map((n) => html`<option value=${n}>${n}</option>`)}
        </select>
      </label>
      <label>vCPUs <input name="vcpus" type="number" min="1" step="1" placeholder="default" /></label>
      <label>Memory (GiB) <input name="mem" type="number" min="0.125" step="0.125" placeholder="default" /></label>
      <label>Disk (GiB) <input name="disk" type="number" min="1" step="1" placeholder="default" /></label>
      <label>Idle TTL (s) <input name="idle" type="number" min="0" step="1" placeholder="default" /></label>
      <label>Delete after stop (s) <input name="after" type="number" min="0" step="1" placeholder="default" /></label>
      <label>Labels <input name="labels" placeholder="team=ml, env=dev" /></label>
      <label class="check"><input name="persistent" type="checkbox" /> Persistent</label>
    </div>
    <${Alert} error=${error && `Not created: ${error}`} />
    <button type="submit" disabled=${busy}>${busy ? "Creating…" : "Create"}</button>
  </form>`;
}

function SandboxPage({ name }) {
  const [box, error, reload] = usePoll(() => api("GET", `${boxes}/${enc(name)}`), 2000, [name]);
  const [run, busy, actionError] = useAction();
  const snapshotName = useSnapshotNames();
  const act = (f) => run(async () => {
    await f();
    reload();
  });
  if (!box) {
    return html`<section><h1>${name}</h1><${Alert} error=${error} />${!error && html`<p>Loading…</p>`}</section>`;
  }
  const path = `${boxes}/${enc(box.name)}`;
  const rename = () => {
    const to = prompt("New name", box.name);
    if (to && to !== box.name) {
      run(async () => {
        await api("PATCH", path, { body: { name: to } });
        location.hash = `#/sandboxes/${enc(to)}`;
      });
    }
  };
  const capture = () => {
    const snap = prompt("Snapshot name", `${box.name}-snapshot`);
    if (snap) act(() => api("POST", `${path}/snapshot`, { body: { name: snap } }));
  };
  const remove = () => {
    if (confirm(`Delete ${box.name}? Its disk goes with it.`)) {
      run(async () => {
        await api("DELETE", path);
        location.hash = "#/";
      });
    }
  };
  const ready = box.status === "ready";
  const dataplane = box.dataplane_url ? new URL(box.dataplane_url, location.href).pathname : null;
  return html`<section aria-labelledby="sandbox-title">
    <div class="heading">
      <h1 id="sandbox-title">${box.name}</h1>
      <${Status} status=${box.status} />
    </div>
    ${box.status_message && html`<p class="notice">${box.status_message}</p>`}
    <div class="actions" role="group" aria-label="Actions">
      <button onClick=${() => act(() => api("POST", `${path}/start`))} disabled=${busy || ready}>Start</button>
      <button onClick=${() => act(() => api("POST", `${path}/stop`))} disabled=${busy || !ready}>Stop</button>
      <button onClick=${rename} disabled=${busy}>Rename</button>
      <button onClick=${capture} disabled=${busy || !ready}>Capture snapshot</button>
      <button class="danger" onClick=${remove} disabled=${busy}>Delete</button>
    </div>
    <${Alert} error=${actionError || error} />
    <details class="card">
      <summary>Configuration</summary>
      <dl class="facts">
        <dt>Id</dt><dd>${box.id}</dd>
        <dt>Size</dt><dd>${box.vcpus} vCPU, ${bytes(box.mem_bytes)} memory, ${bytes(box.fs_capacity_bytes)} disk</dd>
        <dt>Snapshot</dt><dd>${snapshotName(box.snapshot_id)}</dd>
        ${box.host_id && html`<dt>Host</dt><dd>${box.host_id}</dd>`}
        <dt>Last used</dt><dd>${box.last_activity_at} (${since(box.last_activity_at)} ago)</dd>
        <dt>Persistent</dt><dd>${box.persistent ? "yes" : "no"}${box.preserve_memory_on_stop ? ", memory kept on stop" : ""}</dd>
        <dt>Idle TTL</dt><dd>${box.idle_ttl_seconds ? `${box.idle_ttl_seconds} s` : "never"}</dd>
        <dt>Created</dt><dd>${box.created_at} (${since(box.created_at)} ago)</dd>
        <dt>Egress</dt><dd>${box.proxy_config ? html`<pre>${JSON.stringify(box.proxy_config, null, 2)}</pre>` : "no rules"}</dd>
      </dl>
    </details>
    ${ready && html`<${Usage} key=${`u${box.id}`} name=${box.name} />`}
    ${ready && html`<${Links} key=${`l${box.id}`} path=${path} />`}
    ${ready && dataplane
      ? html`<${TerminalPanel} key=${box.id} dataplane=${dataplane} />
             <${Files} key=${`f${box.id}`} dataplane=${dataplane} />`
      : html`<p class="empty">The terminal and files open when the sandbox is ready.</p>`}
    <${History} key=${`h${box.id}`} path=${path} status=${box.status} />
  </section>`;
}

function TerminalPanel({ dataplane }) {
  const ref = useRef(null);
  const [state, setState] = useState("connecting");
  useEffect(() => {
    const t = openTerminal(ref.current, dataplane, setState);
    window.hearthTerminal = t;
    return () => {
      window.hearthTerminal = null;
      t.dispose();
    };
  }, [dataplane]);
  return html`<div class="card">
    <div class="heading"><h2>Terminal</h2><span class="term-state" role="status">${state}</span></div>
    <div class="terminal" ref=${ref} aria-label="Terminal"></div>
  </div>`;
}

function Files({ dataplane }) {
  const [dir, setDir] = useState("/root");
  const [shown, setShown] = useState("/root");
  const [listing, error, reload] = usePoll(
    () => api("POST", `${dataplane}/glob`, { body: { path: shown, pattern: "*", limit: 500 } }),
    0,
    [shown],
  );
  const [run, busy, actionError] = useAction();
  const upload = (e) => {
    e.preventDefault();
    const file = e.target.elements.file.files[0];
    if (!file) return;
    const to = `${shown.replace(/\/$/, "")}/${file.name}`;
    const form = new FormData();
    form.append("file", file, file.name);
    run(async () => {
      await api("POST", `${dataplane}/upload?path=${enc(to)}`, { body: form });
      e.target.reset();
      reload();
    });
  };
  const download = (path) => run(async () => {
    const resp = await api("GET", `${dataplane}/download?path=${enc(path)}`, { raw: true });
    const blob = await resp.blob();
    const a = document.createElement("a");
    a.href = URL.createObjectURL(blob);
    a.download = path.split("/").pop();
    document.body.append(a);
    a.click();
    a.remove();
    setTimeout(() => URL.revokeObjectURL(a.href), 10000);
  });
  const entries = (listing && listing.matches) || [];
  const open = (path) => {
    setDir(path);
    setShown(path);
  };
  const parent = shown.replace(/\/[^/]*\/?$/, "") || "/";
  return html`<div class="card">
    <h2>Files</h2>
    <form class="filters" onSubmit=${(e) => { e.preventDefault(); setShown(dir); }}>
      <label>Directory <input name="dir" value=${dir} onInput=${(e) => setDir(e.target.value)} /></label>
      <button type="submit">List</button>
    </form>
    <${Alert} error=${actionError || error} />
    <ul class="files" aria-label=${`Files in ${shown}`}>
      ${shown !== "/" && html`<li><button class="link" onClick=${() => open(parent)}>..</button></li>`}
      ${entries.map((f) => html`<li key=${f.path}>
        ${f.is_dir
          ? html`<button class="link" onClick=${() => open(f.path)}>${f.path}/</button>`
          : html`<button class="link" onClick=${() => download(f.path)} disabled=${busy}
              aria-label=${`Download ${f.path}`}>${f.path}</button> <span class="hint">${bytes(f.size_bytes)}</span>`}
      </li>`)}
    </ul>
    <form onSubmit=${upload}>
      <label>Upload to ${shown} <input type="file" name="file" /></label>
      <button type="submit" disabled=${busy}>Upload</button>
    </form>
  </div>`;
}

// ---------------------------------------------------------------------------
// Snapshots and secrets

function Snapshots() {
  const [list, error, reload] = usePoll(() => api("GET", "/api/v2/sandboxes/snapshots?page_size=200"), 5000, []);
  const [run, busy, actionError] = useAction();
  const remove = (s) => {
    if (confirm(`Delete snapshot ${s.name}?`)) {
      run(async () => {
        await api("DELETE", `/api/v2/sandboxes/snapshots/${enc(s.id)}`);
        reload();
      });
    }
  };
  const items = (list && list.items) || [];
  return html`<section aria-labelledby="snapshots-title">
    <h1 id="snapshots-title">Snapshots</h1>
    <${Alert} error=${actionError || error} />
    <div class="table-wrap"><table>
      <thead><tr><th scope="col">Name</th><th scope="col">Status</th><th scope="col">Image</th>
        <th scope="col">Disk</th><th scope="col">Memory</th><th scope="col">Age</th><th scope="col"><span class="visually-hidden">Actions</span></th></tr></thead>
      <tbody>${items.map((s) => html`<tr key=${s.id}>
        <td>${s.name}</td><td><${Status} status=${s.status} /></td><td>${s.docker_image || ""}</td>
        <td>${bytes(s.fs_capacity_bytes)}</td><td>${s.memory_snapshot_size_bytes ? bytes(s.memory_snapshot_size_bytes) : ""}</td>
        <td>${since(s.created_at)}</td>
        <td><button class="danger" onClick=${() => remove(s)} disabled=${busy}>Delete</button></td>
      </tr>`)}</tbody>
    </table></div>
  </section>`;
}

// ---------------------------------------------------------------------------
// Templates (E2B's template API on the same server: built with E2B's
// `Template` SDK or LangSmith's Dockerfile snapshots)

function Templates() {
  const [list, error, reload] = usePoll(() => api("GET", "/templates"), 5000, []);
  const [run, busy, actionError] = useAction();
  const remove = (t) => {
    if (confirm(`Delete template ${t.templateID}? Sandboxes or pools using it keep it.`)) {
      run(async () => {
        await api("DELETE", `/templates/${enc(t.templateID)}`);
        reload();
      });
    }
  };
  const tags = (t) => (t.names || []).map((n) => n.slice(n.lastIndexOf(":") + 1)).join(", ");
  return html`<section aria-labelledby="templates-title">
    <h1 id="templates-title">Templates</h1>
    <p class="hint">Built with E2B's Template SDK or LangSmith's create_snapshot_from_dockerfile; a sandbox of one resumes its memory.</p>
    <${Alert} error=${actionError || error} />
    <div class="table-wrap"><table>
      <thead><tr><th scope="col">Name</th><th scope="col">Tags</th><th scope="col">Status</th>
        <th scope="col">Builds</th><th scope="col">Size</th><th scope="col">Updated</th>
        <th scope="col"><span class="visually-hidden">Actions</span></th></tr></thead>
      <tbody>${(list || []).map((t) => html`<tr key=${t.templateID} data-template=${t.templateID}>
        <td><a href=${`#/templates/${enc(t.templateID)}`}>${t.templateID}</a></td><td>${tags(t)}</td>
        <td><${Status} status=${t.buildStatus} /></td><td>${t.buildCount}</td>
        <td>${t.cpuCount} vCPU, ${bytes(t.memoryMB * MiB)} memory, ${bytes(t.diskSizeMB * MiB)} disk</td>
        <td>${since(t.updatedAt)}</td>
        <td><button class="danger" onClick=${() => remove(t)} disabled=${busy}
          aria-label=${`Delete template ${t.templateID}`}>Delete</button></td>
      </tr>`)}</tbody>
    </table></div>
  </section>`;
}

function TemplatePage({ name }) {
  const [t, error] = usePoll(() => api("GET", `/templates/${enc(name)}`), 5000, [name]);
  const [shown, setShown] = useState(null);
  const builds = (t && t.builds) || [];
  return html`<section aria-labelledby="template-title">
    <div class="heading"><h1 id="template-title">${name}</h1>${t && html`<${Status} status=${t.buildStatus} />`}</div>
    <p><a href="#/templates">All templates</a></p>
    <${Alert} error=${error} />
    <div class="table-wrap"><table aria-label="Builds">
      <thead><tr><th scope="col">Build</th><th scope="col">Status</th><th scope="col">Started</th><th scope="col">Finished</th></tr></thead>
      <tbody>${builds.map((b) => html`<tr key=${b.buildID} data-build=${b.buildID}>
        <td><button class="link" onClick=${() => setShown(b.buildID)} aria-label=${`Log of build ${b.buildID}`}>${b.buildID}</button></td>
        <td><${Status} status=${b.status} /></td><td>${b.createdAt}</td><td>${b.finishedAt || ""}</td>
      </tr>`)}</tbody>
    </table></div>
    ${shown && html`<${BuildLog} key=${shown} name=${name} build=${shown} />`}
  </section>`;
}

/** A build's log, read by offset as E2B's SDK reads it, until the build ends. */
function BuildLog({ name, build }) {
  const [lines, setLines] = useState([]);
  const [state, setState] = useState({ status: "building" });
  const [error, setError] = useState(null);
  useEffect(() => {
    let stop = false;
    let offset = 0;
    const path = `/templates/${enc(name)}/builds/${enc(build)}/status`;
    (async () => {
      while (!stop) {
        try {
          const v = await api("GET", `${path}?logsOffset=${offset}`);
          const page = v.logEntries || [];
          offset += page.length;
          if (page.length) setLines((old) => old.concat(page));
          setState(v);
          if (!page.length && (v.status === "ready" || v.status === "error")) break;
          if (!page.length) await new Promise((r) => setTimeout(r, 1000));
        } catch (e) {
          setError(e);
          break;
        }
      }
    })();
    return () => { stop = true; };
  }, [name, build]);
  return html`<div class="card">
    <div class="heading"><h2>Log of build ${build}</h2><${Status} status=${state.status} /></div>
    ${state.reason && html`<p class="notice">Failed: ${state.reason.message}</p>`}
    <${Alert} error=${error} />
    <pre class="build-log" aria-label="Build log">${lines.map((l) => `${l.timestamp} ${l.level} ${l.message}\n`).join("")}</pre>
  </div>`;
}

function Secrets() {
  const path = "/api/v1/workspaces/current/secrets";
  const [list, error, reload] = usePoll(() => api("GET", path), 0, []);
  const [run, busy, actionError] = useAction();
  const set = (e) => {
    e.preventDefault();
    const f = new FormData(e.target);
    run(async () => {
      await api("POST", path, { body: [{ key: f.get("key"), value: f.get("value") }] });
      e.target.reset();
      reload();
    });
  };
  const remove = (key) => run(async () => {
    await api("DELETE", `${path}/${enc(key)}`);
    reload();
  });
  return html`<section aria-labelledby="secrets-title">
    <h1 id="secrets-title">Secrets</h1>
    <p class="hint">Values are write-only: the console shows names, never values.</p>
    <${Alert} error=${actionError || error} />
    <ul class="secrets">${(list || []).map((s) => html`<li key=${s.key}>
      <code>${s.key}</code> <span class="hint">updated ${since(s.updated_at)} ago</span>
      <button class="danger" onClick=${() => remove(s.key)} disabled=${busy} aria-label=${`Delete secret ${s.key}`}>Delete</button>
    </li>`)}</ul>
    <form class="card grid" onSubmit=${set} aria-label="Set a secret">
      <label>Name <input name="key" required /></label>
      <label>Value <input name="value" type="password" autocomplete="off" required /></label>
      <button type="submit" disabled=${busy}>Set</button>
    </form>
  </section>`;
}

function Hosts() {
  const [hosts, error] = usePoll(() => api("GET", "/api/v2/sandboxes/hosts"), 5000, []);
  const pct = (a, b) => (b ? `${Math.round((100 * a) / b)} %` : "");
  return html`<section aria-labelledby="hosts-title">
    <h1 id="hosts-title">Hosts</h1>
    <p class="hint">The fleet, for operators (keys holding fleet:read). Updated every five seconds.</p>
    <${Alert} error=${error} />
    <div class="table-wrap"><table>
      <thead><tr><th scope="col">Host</th><th scope="col">State</th><th scope="col">Lease</th>
        <th scope="col">Sandboxes</th><th scope="col">CPU committed</th><th scope="col">Memory committed</th>
        <th scope="col">Disk free</th><th scope="col">Store</th><th scope="col">Version</th></tr></thead>
      <tbody>${(hosts || []).map((h) => html`<tr key=${h.id} data-host=${h.id}>
        <td><code title=${h.id}>${h.id.slice(0, 8)}</code> <span class="hint">${h.address}</span></td>
        <td><${Status} status=${h.state} /></td>
        <td>${h.lease_live ? "live" : html`<strong>expired</strong>`}</td>
        <td>${h.sandboxes}</td>
        <td>${h.committed_cpu_millicores / 1000} / ${h.capacity_cpu_millicores / 1000} vCPU (${pct(h.committed_cpu_millicores, h.capacity_cpu_millicores)})</td>
        <td>${bytes(h.committed_mem_bytes)} / ${bytes(h.capacity_mem_bytes)} (${pct(h.committed_mem_bytes, h.capacity_mem_bytes)})</td>
        <td class="host-disk">${bytes(h.disk_free_bytes)}</td>
        <td>${h.store_error ? html`<span class="alert-text">${h.store_error}</span>` : "ok"}</td>
        <td>${h.version}</td>
      </tr>`)}</tbody>
    </table></div>
  </section>`;
}

function Pools() {
  const path = "/api/v2/sandboxes/pools";
  const [list, error, reload] = usePoll(() => api("GET", path), 3000, []);
  const [run, busy, actionError] = useAction();
  const items = Array.isArray(list) ? list : (list && (list.items || list.pools)) || [];
  const create = (e) => {
    e.preventDefault();
    const f = new FormData(e.target);
    const body = { name: String(f.get("name")), size: Number(f.get("size")) };
    if (f.get("snapshot")) body.snapshot = String(f.get("snapshot"));
    if (f.get("mem")) body.mem_bytes = Math.round(Number(f.get("mem")) * GiB);
    run(async () => {
      await api("POST", path, { body });
      e.target.reset();
      reload();
    });
  };
  const resize = (p) => {
    const to = prompt(`New size of pool ${p.name}`, String(p.size));
    if (to !== null) {
      run(async () => {
        await api("PATCH", `${path}/${enc(p.name)}`, { body: { size: Number(to) } });
        reload();
      });
    }
  };
  const remove = (p) => {
    if (confirm(`Delete pool ${p.name}? Its ready members are stopped.`)) {
      run(async () => {
        await api("DELETE", `${path}/${enc(p.name)}`);
        reload();
      });
    }
  };
  return html`<section aria-labelledby="pools-title">
    <h1 id="pools-title">Warm pools</h1>
    <p class="hint">Paused VMs kept ready for one snapshot and size: a create that matches claims one instead of booting.</p>
    <${Alert} error=${actionError || error} />
    <div class="table-wrap"><table>
      <thead><tr><th scope="col">Name</th><th scope="col">Size</th><th scope="col">Ready</th>
        <th scope="col">Warming</th><th scope="col">Claims</th><th scope="col">Misses</th>
        <th scope="col">Memory</th><th scope="col"><span class="visually-hidden">Actions</span></th></tr></thead>
      <tbody>${items.map((p) => html`<tr key=${p.id} data-pool=${p.name}>
        <td>${p.name}</td><td>${p.size}</td><td class="pool-ready">${p.status.ready}</td><td>${p.status.warming}</td>
        <td>${p.status.claims}</td><td>${p.status.misses}</td><td>${bytes(p.mem_bytes)}</td>
        <td class="actions"><button onClick=${() => resize(p)} disabled=${busy} aria-label=${`Resize pool ${p.name}`}>Resize</button>
          <button class="danger" onClick=${() => remove(p)} disabled=${busy} aria-label=${`Delete pool ${p.name}`}>Delete</button></td>
      </tr>`)}</tbody>
    </table></div>
    <form class="card grid" onSubmit=${create} aria-label="New pool">
      <label>Name <input name="name" required /></label>
      <label>Snapshot <input name="snapshot" placeholder="default image" /></label>
      <label>Size <input name="size" type="number" min="0" step="1" required /></label>
      <label>Memory (GiB) <input name="mem" type="number" min="0.125" step="0.125" placeholder="default" /></label>
      <button type="submit" disabled=${busy}>Create pool</button>
    </form>
  </section>`;
}

function Links({ path }) {
  const [run, busy, error] = useAction();
  const [links, setLinks] = useState([]);
  const [notice, setNotice] = useState("");
  const service = (e) => {
    e.preventDefault();
    const f = new FormData(e.target);
    const port = Number(f.get("port"));
    // "": a token link; otherwise the port is shared with signed-in keys.
    const access = String(f.get("access") || "");
    run(async () => {
      const body = access ? { port, access } : { port };
      const r = await api("POST", `${path}/service-url`, { body });
      const label = access ? `port ${port} (signed-in, ${access})` : `port ${port}`;
      setNotice("");
      setLinks((l) => [{ label, url: r.browser_url, expires: r.expires_at, port, signedIn: !!access }, ...l]);
    });
  };
  const unshare = (e) => {
    e.preventDefault();
    const raw = String(new FormData(e.target).get("port") || "");
    const what = raw ? `port ${raw}` : "every port";
    if (!confirm(`Stop sharing ${what} with signed-in users? Their next request is refused.`)) return;
    run(async () => {
      await api("DELETE", `${path}/service-urls${raw ? `?port=${enc(raw)}` : ""}`);
      setLinks((l) => l.filter((x) => !(x.signedIn && (!raw || x.port === Number(raw)))));
      setNotice(`${what[0].toUpperCase()}${what.slice(1)} is no longer shared with signed-in users.`);
      e.target.reset();
    });
  };
  const download = (e) => {
    e.preventDefault();
    const file = String(new FormData(e.target).get("file"));
    run(async () => {
      const r = await api("POST", `${path}/download-url`, { body: { path: file } });
      setLinks((l) => [{ label: file, url: r.download_url, expires: r.expires_at }, ...l]);
    });
  };
  return html`<div class="card">
    <h2>Links</h2>
    <p class="hint">Anyone holding a link reaches the service or file until it expires, without a key; a port shared with signed-in users opens to them on its own origin until you stop sharing it.</p>
    <div class="filters">
      <form class="filters" onSubmit=${service} aria-label="Service URL">
        <label>Service URL for port <input name="port" type="number" min="1" max="65535" required /></label>
        <label>Access <select name="access">
          <option value="">anyone with the link</option>
          <option value="workspace">signed-in keys of this workspace</option>
          <option value="restricted">signed-in keys that may read sandboxes</option>
        </select></label>
        <button type="submit" disabled=${busy}>Make link</button>
      </form>
      <form class="filters" onSubmit=${unshare} aria-label="Stop sharing">
        <label>Stop sharing port <input name="port" type="number" min="1" max="65535" placeholder="all" /></label>
        <button type="submit" class="danger" disabled=${busy}>Stop sharing</button>
      </form>
      <form class="filters" onSubmit=${download} aria-label="Download link">
        <label>Download link for file <input name="file" required placeholder="/root/out.txt" /></label>
        <button type="submit" disabled=${busy}>Make link</button>
      </form>
    </div>
    <${Alert} error=${error} />
    ${notice && html`<p class="notice unshared" role="status">${notice}</p>`}
    <ul class="files">${links.map((l) => html`<li><a href=${l.url} target="_blank" rel="noopener noreferrer">${l.label}</a>
      ${l.expires && html`<span class="hint"> until ${l.expires}</span>`}</li>`)}</ul>
  </div>`;
}

const PERMISSIONS = [
  "sandboxes:read", "sandboxes:create", "sandboxes:update", "sandboxes:delete",
  "sandboxes:exec", "sandboxes:*", "keys:manage", "*",
];

function Keys() {
  const path = "/api/v1/api-key";
  const [list, error, reload] = usePoll(() => api("GET", path), 0, []);
  const [run, busy, actionError] = useAction();
  const [made, setMade] = useState(null);
  const create = (e) => {
    e.preventDefault();
    const f = new FormData(e.target);
    const permissions = f.getAll("permission");
    run(async () => {
      const key = await api("POST", path, {
        body: {
          description: String(f.get("description") || ""),
          // None ticked: the same permissions as the signed-in key.
          permissions: permissions.length ? permissions : undefined,
        },
      });
      setMade(key);
      e.target.reset();
      reload();
    });
  };
  const revoke = (k) => {
    if (confirm(`Revoke ${k.short_key} (${k.description || "no description"})? It stops working at once.`)) {
      run(async () => {
        await api("DELETE", `${path}/${enc(k.id)}`);
        reload();
      });
    }
  };
  return html`<section aria-labelledby="keys-title">
    <h1 id="keys-title">API keys</h1>
    <${Alert} error=${actionError || error} />
    ${made && html`<div class="notice new-key" role="status">
      <p>New key <strong>${made.short_key}</strong>. Copy it now: it is not shown again.</p>
      <code class="secret">${made.key}</code>
      <button class="link" onClick=${() => setMade(null)}>Done</button>
    </div>`}
    <div class="table-wrap"><table>
      <thead><tr><th scope="col">Key</th><th scope="col">Description</th><th scope="col">Permissions</th>
        <th scope="col">Created</th><th scope="col"><span class="visually-hidden">Actions</span></th></tr></thead>
      <tbody>${(list || []).map((k) => html`<tr key=${k.id} data-key=${k.id}>
        <td><code>${k.short_key}</code></td><td>${k.description}</td><td>${k.permissions.join(", ")}</td>
        <td>${since(k.created_at)} ago</td>
        <td><button class="danger" onClick=${() => revoke(k)} disabled=${busy}
          aria-label=${`Revoke ${k.short_key}`}>Revoke</button></td>
      </tr>`)}</tbody>
    </table></div>
    <form class="card" onSubmit=${create} aria-label="New API key">
      <h2>New key</h2>
      <label>Description <input name="description" maxlength="1024" /></label>
      <fieldset>
        <legend>Permissions (none ticked: the same as yours)</legend>
        ${PERMISSIONS.map((p) => html`<label class="check"><input type="checkbox" name="permission" value=${p} /> ${p}</label>`)}
      </fieldset>
      <button type="submit" disabled=${busy}>Create key</button>
    </form>
  </section>`;
}

// ---------------------------------------------------------------------------
// The frame

function App() {
  const [signedIn, setSignedIn] = useState(!!session.key());
  const [notice, setNotice] = useState(null);
  const route = useRoute();
  useEffect(() => onSignedOut((message) => {
    setNotice(message);
    setSignedIn(false);
  }), []);
  const signOut = useCallback(() => {
    session.signOut();
    setNotice("Signed out.");
    setSignedIn(false);
  }, []);
  if (!signedIn) {
    return html`<${SignIn} notice=${notice} onSignIn=${() => { setNotice(null); setSignedIn(true); }} />`;
  }
  let page;
  const m = route.match(/^\/sandboxes\/(.+)$/);
  if (m) page = html`<${SandboxPage} name=${decodeURIComponent(m[1])} />`;
  else if (route === "/snapshots") page = html`<${Snapshots} />`;
  else if (route === "/templates") page = html`<${Templates} />`;
  else if (route.startsWith("/templates/")) page = html`<${TemplatePage} name=${decodeURIComponent(route.slice("/templates/".length))} />`;
  else if (route === "/secrets") page = html`<${Secrets} />`;
  else if (route === "/keys") page = html`<${Keys} />`;
  else if (route === "/pools") page = html`<${Pools} />`;
  else if (route === "/hosts") page = html`<${Hosts} />`;
  else page = html`<${SandboxList} />`;
  const current = (r) => (route === r || (r === "/" && (route === "" || route.startsWith("/sandboxes"))) ? "page" : undefined);
  return html`<div class="frame">
    <header>
      <span class="brand">Hearth</span>
      <nav aria-label="Main">
        <a href="#/" aria-current=${current("/")}>Sandboxes</a>
        <a href="#/snapshots" aria-current=${current("/snapshots")}>Snapshots</a>
        <a href="#/templates" aria-current=${route.startsWith("/templates") ? "page" : undefined}>Templates</a>
        <a href="#/secrets" aria-current=${current("/secrets")}>Secrets</a>
        <a href="#/pools" aria-current=${current("/pools")}>Pools</a>
        <a href="#/keys" aria-current=${current("/keys")}>API keys</a>
        <a href="#/hosts" aria-current=${current("/hosts")}>Hosts</a>
      </nav>
      <button class="signout" onClick=${signOut}>Sign out</button>
    </header>
    <main id="main" tabindex="-1">${page}</main>
  </div>`;
}

render(html`<${App} />`, document.getElementById("app"));

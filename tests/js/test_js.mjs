// The unmodified JS/TS SDKs against `hearth up`: LangSmith's
// `langsmith/sandbox` (LANGSMITH_ENDPOINT, LANGSMITH_API_KEY) and E2B's
// `e2b` (E2B_API_KEY, E2B_API_URL, E2B_SANDBOX_URL), versions pinned in
// tests/js/package-lock.json. Run by crates/hearth-cli/tests/cli/vm/sdk.rs
// from a copy next to its node_modules, with HEARTH_JS_OTHER_KEY (a key of
// another workspace) and HEARTH_JS_SNAPSHOT (a snapshot to create from).
//
// Each test prints PASS or FAIL; the exit status is 1 if any failed.

import { SandboxClient, LangSmithResourceNotFoundError } from "langsmith/sandbox";
import { Sandbox, NotFoundError, Volume, Template, waitForFile } from "e2b";
import { mkdtempSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { Sandbox as CodeInterpreter } from "@e2b/code-interpreter";

const SNAPSHOT = process.env.HEARTH_JS_SNAPSHOT || "busybox";
const OTHER_KEY = process.env.HEARTH_JS_OTHER_KEY;
const made = { langsmith: [], e2b: [] };

function check(cond, what) {
  if (!cond) throw new Error(what);
}

const text = (bytes) => new TextDecoder().decode(bytes);

async function langsmithSandboxRunsCommandsAndFiles() {
  const client = new SandboxClient();
  const sb = await client.createSandbox({ snapshotName: SNAPSHOT, timeout: 300 });
  made.langsmith.push(sb.name);
  check(sb.status === "ready", `ready: ${sb.status}`);
  const r = await sb.run("echo hello-from-js; echo oops >&2; exit 3");
  check(r.stdout === "hello-from-js\n", `stdout ${JSON.stringify(r.stdout)}`);
  check(r.stderr === "oops\n", `stderr ${JSON.stringify(r.stderr)}`);
  check(r.exit_code === 3, `exit code ${r.exit_code}`);
  const bytes = new Uint8Array(70000).map((_, i) => (i * 7) % 256);
  await sb.write("/root/js.bin", bytes);
  const back = await sb.read("/root/js.bin");
  check(back.length === bytes.length && back.every((b, i) => b === bytes[i]), "the file back byte for byte");
  const listed = (await client.listSandboxes()).map((s) => s.name);
  check(listed.includes(sb.name), `listed: ${listed}`);
  // Another workspace's key sees no such sandbox.
  const other = new SandboxClient({ apiKey: OTHER_KEY });
  let refused = false;
  try {
    await other.getSandbox(sb.name);
  } catch (e) {
    refused = e instanceof LangSmithResourceNotFoundError;
  }
  check(refused, "another workspace gets not-found");
  await client.deleteSandbox(sb.name);
  made.langsmith.pop();
}

async function langsmithStreamsACommand() {
  const client = new SandboxClient();
  const sb = await client.createSandbox({ snapshotName: SNAPSHOT, timeout: 300 });
  made.langsmith.push(sb.name);
  const chunks = [];
  const r = await sb.run("for i in 1 2 3; do echo line-$i; sleep 0.2; done", {
    onStdout: (c) => chunks.push(c),
  });
  check(r.exit_code === 0, `exit ${r.exit_code}`);
  check(chunks.join("") === "line-1\nline-2\nline-3\n", `streamed ${JSON.stringify(chunks)}`);
  await client.deleteSandbox(sb.name);
  made.langsmith.pop();
}

async function e2bSandboxRunsCommandsAndFiles() {
  const sbx = await Sandbox.create(SNAPSHOT, { timeoutMs: 300_000 });
  made.e2b.push(sbx.sandboxId);
  const r = await sbx.commands.run("echo hello-e2b-js && echo $HOME && id -un");
  check(r.exitCode === 0, `exit ${r.exitCode}`);
  check(r.stdout === "hello-e2b-js\n/home/user\nuser\n", `stdout ${JSON.stringify(r.stdout)}`);
  let failed = null;
  try {
    await sbx.commands.run("exit 4");
  } catch (e) {
    failed = e;
  }
  check(failed && failed.exitCode === 4, `a failing command throws with its exit code: ${failed}`);
  await sbx.files.write("/home/user/e2b-js.txt", "written by the JS SDK");
  check((await sbx.files.read("/home/user/e2b-js.txt")) === "written by the JS SDK", "read back");
  const entries = (await sbx.files.list("/home/user")).map((e) => e.name);
  check(entries.includes("e2b-js.txt"), `listed: ${entries}`);
  const out = [];
  const bg = await sbx.commands.run("for i in 1 2 3; do echo tick-$i; sleep 0.2; done", {
    background: true,
    onStdout: (d) => out.push(d),
  });
  const done = await bg.wait();
  check(done.exitCode === 0 && out.join("") === "tick-1\ntick-2\ntick-3\n", `streamed ${JSON.stringify(out)}`);
  // A streamed watch (the JS SDK's files.watchDir).
  const seen = [];
  await sbx.files.makeDir("/home/user/w");
  const watch = await sbx.files.watchDir("/home/user/w", (ev) => seen.push(`${ev.type}:${ev.name}`), {
    recursive: true,
  });
  await sbx.files.write("/home/user/w/a.txt", "x");
  await sbx.commands.run("mkdir /home/user/w/sub && sleep 0.5 && echo y > /home/user/w/sub/b.txt && rm /home/user/w/a.txt");
  const want = ["create:a.txt", "create:sub", "create:sub/b.txt", "remove:a.txt"];
  for (let t = Date.now(); !want.every((w) => seen.includes(w)) && Date.now() - t < 20000; ) {
    await new Promise((r) => setTimeout(r, 200));
  }
  check(want.every((w) => seen.includes(w)), `watched: ${seen}`);
  await watch.stop();
  const listed = (await Sandbox.list().nextItems()).map((s) => s.sandboxId);
  check(listed.includes(sbx.sandboxId), `listed: ${listed}`);
  let hidden = false;
  try {
    await Sandbox.connect(sbx.sandboxId, { apiKey: OTHER_KEY });
  } catch (e) {
    hidden = e instanceof NotFoundError || /not found/i.test(String(e));
  }
  check(hidden, "another workspace cannot connect to it");
  // Its metrics: the guest's own samples over its life, one every five
  // seconds (a copy of a template began its life a moment ago).
  let metrics = await sbx.getMetrics();
  for (let t = Date.now(); metrics.length === 0 && Date.now() - t < 15000; ) {
    await new Promise((r) => setTimeout(r, 500));
    metrics = await sbx.getMetrics();
  }
  const last = metrics.at(-1);
  check(metrics.length >= 1 && last.memTotal > last.memUsed && last.memUsed > 0, `metrics ${JSON.stringify(metrics)}`);
  // Killed while a command runs: the command's wait rejects with the
  // SDK's own error for a sandbox gone (a timeout, as E2B's edge says it).
  const running = await sbx.commands.run("sleep 60", { background: true });
  const killed = new Promise((resolve) => setTimeout(() => resolve(sbx.kill()), 1000));
  let ended = null;
  try {
    await running.wait();
  } catch (e) {
    ended = e;
  }
  // The kill has answered (the sandbox is gone, not still going).
  await killed;
  check(ended && /TimeoutError|NotRunning/.test(ended.constructor.name), `killed during a run: ${ended}`);
  made.e2b.pop();
}

// E2B's volumes from JS: made, mounted read-write by one sandbox, its
// files read by the next and through the content API, destroyed.
async function e2bVolumesOutliveTheirSandboxes() {
  const name = `js-vol-${process.pid}`;
  const vol = await Volume.create(name);
  check(vol.name === name && vol.volumeId, `made ${vol.volumeId}`);
  const first = await Sandbox.create(SNAPSHOT, { timeoutMs: 300_000, volumeMounts: { "/mnt/data": vol } });
  made.e2b.push(first.sandboxId);
  const info = await first.getInfo();
  check(JSON.stringify(info.volumeMounts) === JSON.stringify([{ name, path: "/mnt/data" }]), `mounts ${JSON.stringify(info.volumeMounts)}`);
  await first.files.write("/mnt/data/js.txt", "kept by js");
  await first.kill();
  made.e2b.pop();
  const next = await Sandbox.create(SNAPSHOT, { timeoutMs: 300_000, volumeMounts: { "/data": name } });
  made.e2b.push(next.sandboxId);
  check((await next.files.read("/data/js.txt")) === "kept by js", "the next sandbox reads it");
  await next.kill();
  made.e2b.pop();
  check((await Volume.list()).some((v) => v.name === name), "listed");
  // Its content API, with no sandbox holding it (E2B_VOLUME_API_URL).
  const open = await Volume.connect(vol.volumeId);
  check(open.token, "a token for the content API");
  check((await open.readFile("/js.txt")) === "kept by js", "read through the content API");
  await open.makeDir("/a/b", { force: true });
  const written = await open.writeFile("/a/b/c.txt", "from js", { mode: 0o600 });
  check(written.mode === 0o600 && written.uid === 1000, `written ${JSON.stringify(written)}`);
  const names = (await open.list("/")).map((e) => e.name).sort();
  check(JSON.stringify(names) === JSON.stringify(["a", "js.txt"]), `listed ${names}`);
  await open.remove("/a");
  check(!(await open.exists("/a")), "removed");
  check(await Volume.destroy(vol.volumeId), "destroyed");
  check(!(await Volume.destroy(vol.volumeId)), "destroying what is gone is false");
}

// @e2b/code-interpreter: its default template, state kept between runs,
// a rich result and an error as values.
async function e2bCodeInterpreterRunsCode() {
  // A loaded CI host boots the Debian image and starts Jupyter in more
  // than the SDK's default 60 s a request may take.
  const slow = { requestTimeoutMs: 300_000 };
  const sbx = await CodeInterpreter.create({ timeoutMs: 300_000, ...slow });
  made.e2b.push(sbx.sandboxId);
  const first = await sbx.runCode("x = 40\nx + 2", slow);
  check(first.text === "42", `first result ${JSON.stringify(first.text)} ${JSON.stringify(first.error)}`);
  const out = [];
  const second = await sbx.runCode("print(x * 2)", { ...slow, onStdout: (m) => out.push(m.line) });
  check(out.join("") === "80\n" && second.logs.stdout.join("") === "80\n", `state kept: ${JSON.stringify(out)}`);
  const failed = await sbx.runCode("1 / 0", slow);
  check(failed.error && failed.error.name === "ZeroDivisionError", `an error: ${JSON.stringify(failed.error)}`);
  await sbx.kill();
  made.e2b.pop();
}

// E2B's Template builder: a copy, env, a command and a start command,
// built with its logs; a sandbox of it starts with the start command
// running (the build captured its memory).
async function e2bTemplateBuildsAndStartsRunning() {
  const dir = mkdtempSync(join(tmpdir(), "hearth-js-template-"));
  writeFileSync(join(dir, "hello.txt"), "from-js\n");
  const name = `js-template-${process.pid}`;
  const t = Template({ fileContextPath: dir })
    .fromTemplate(SNAPSHOT)
    .setEnvs({ JS_MODE: "built" })
    .copy("hello.txt", "/home/user/")
    .runCmd("echo js-step > /home/user/step.txt")
    .setStartCmd("while true; do date +%s > /tmp/alive; sleep 1; done", waitForFile("/tmp/alive"));
  const logs = [];
  const info = await Template.build(t, name, { onBuildLogs: (e) => logs.push(e.message) });
  check(info.name === name, `built ${JSON.stringify(info)}`);
  check(logs.some((m) => m.includes("RUN echo js-step")), `logs: ${logs.join(" | ")}`);
  check(await Template.exists(name), "the template exists");
  const sbx = await Sandbox.create(name, { timeoutMs: 120_000 });
  made.e2b.push(sbx.sandboxId);
  const r = await sbx.commands.run(
    "cat /home/user/hello.txt /home/user/step.txt; echo $JS_MODE; a=$(cat /tmp/alive); sleep 2; [ $(cat /tmp/alive) -gt $a ] && echo running",
  );
  check(r.stdout === "from-js\njs-step\nbuilt\nrunning\n", `the sandbox: ${JSON.stringify(r.stdout)}`);
  await sbx.kill();
  made.e2b.pop();
}

const tests = [
  langsmithSandboxRunsCommandsAndFiles,
  langsmithStreamsACommand,
  e2bSandboxRunsCommandsAndFiles,
  e2bVolumesOutliveTheirSandboxes,
  e2bCodeInterpreterRunsCode,
  e2bTemplateBuildsAndStartsRunning,
];

let failed = 0;
const only = process.argv.slice(2);
for (const t of tests.filter((t) => only.length === 0 || only.includes(t.name))) {
  const started = Date.now();
  try {
    await t();
    console.log(`PASS ${t.name} (${((Date.now() - started) / 1000).toFixed(1)}s)`);
  } catch (e) {
    failed += 1;
    console.log(`FAIL ${t.name} (${((Date.now() - started) / 1000).toFixed(1)}s): ${e && e.stack ? e.stack : e}`);
  }
}
// Whatever a failed test left behind goes.
const client = new SandboxClient();
for (const name of made.langsmith) {
  await client.deleteSandbox(name).catch((e) => console.log(`cleanup ${name}: ${e}`));
}
for (const id of made.e2b) {
  await Sandbox.kill(id).catch((e) => console.log(`cleanup ${id}: ${e}`));
}
process.exit(failed ? 1 : 0);

// Real-browser test of `backprop ui` (Debian's chromium driven by playwright-core from npm):
// log in, start a tiny-chat run from the New-run page (upload a dataset, see its preview and the
// memory plan), watch the loss chart gain points while it trains, stop it, resume it to a later
// step, export a GGUF, and check the console shows no CSP violation or script error. Keeps a
// screenshot of the run page. Run by tests/ui/browser_test.cpp:
//   node browser_test.mjs BACKPROP_EXE SOURCE_DIR WORK_DIR SCREENSHOT_PATH
import { execFileSync, spawn } from "node:child_process";
import { createRequire } from "node:module";
import fs from "node:fs";
import net from "node:net";
import path from "node:path";

const require = createRequire(path.join(process.argv[3], "tests/oracles/package.json"));
const { chromium } = require("playwright-core");
const [exe, srcDir, work, shot] = process.argv.slice(2);
const t0 = Date.now();
const log = (m) => console.log(`[${((Date.now() - t0) / 1000).toFixed(1)} s] ${m}`);

function freePort() {
  return new Promise((resolve) => {
    const s = net.createServer().listen(0, "127.0.0.1", () => { const p = s.address().port; s.close(() => resolve(p)); });
  });
}
async function waitReady(url) {
  for (let i = 0; i < 600; i++) {
    try { await fetch(url); return; } catch { await new Promise((r) => setTimeout(r, 100)); }
  }
  throw new Error("backprop ui did not answer at " + url);
}

// page.waitForFunction evaluates a string in the page, which the UI's CSP (rightly) forbids; poll
// page.evaluate (run by the DevTools protocol, outside the page's CSP) instead.
async function waitUntil(page, fn, arg, what) {
  for (let i = 0; i < 600; i++) {
    if (await page.evaluate(fn, arg)) return;
    await new Promise((r) => setTimeout(r, 200));
  }
  throw new Error("timed out waiting for " + what);
}

// Waits for the run page's head to show `status`; on a timeout the error carries what the server
// says of the run (its status, error and last events), so a failure under load explains itself.
async function waitStatus(page, id, status) {
  try {
    await page.waitForSelector(`#run-head[data-status=${status}]`);
  } catch (e) {
    const run = await page.evaluate(async (i) => {
      try { return await (await fetch("/api/runs/" + encodeURIComponent(i))).text(); } catch (err) { return String(err); }
    }, id);
    throw new Error(`run ${id} never showed status ${status}: ${e.message}\nserver says: ${run.slice(0, 4000)}`);
  }
}

const port = await freePort();
const base = `http://127.0.0.1:${port}`;
const ui = spawn(exe, ["ui", "--port", String(port), "--runs", path.join(work, "runs"), "--data-dir",
  path.join(work, "data"), "--auth", "tester:browser pass", "--stream-lifetime-s", "3"], { stdio: ["ignore", "inherit", "inherit"] });
let browser, runId;
const problems = [];
let allow409 = false;
try {
  await waitReady(base + "/login");
  browser = await chromium.launch({ executablePath: "/usr/bin/chromium",
    args: ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"] });
  const page = await browser.newPage({ viewport: { width: 1200, height: 1600 } });
  page.on("console", (m) => {
    if (allow409 && m.text().includes("status of 409")) return;  // the upload conflict below, on purpose
    if (m.type() === "error" || m.type() === "warning") problems.push(`console ${m.type()}: ${m.text()}`);
  });
  page.on("pageerror", (e) => problems.push("page error: " + e.message));
  page.setDefaultTimeout(60000);

  // Login: every page redirects there first.
  await page.goto(base + "/");
  if (!page.url().endsWith("/login")) throw new Error("not sent to the login page: " + page.url());
  await page.fill("#user", "tester");
  await page.fill("#password", "browser pass");
  await page.click("button[type=submit]");
  await page.waitForSelector("#runs-table");
  log("logged in; runs page shown");

  // New run: model, dataset upload (preview + validate report), settings, memory plan.
  await page.click("#nav-new");
  await page.waitForSelector("#set-training-steps");
  await page.fill("#model", path.join(srcDir, "models/tiny-chat"));
  await page.dispatchEvent("#model", "change");
  await page.waitForSelector("#plan-verdict");
  const plan1 = await page.textContent("#plan-verdict");
  await page.setInputFiles("#upload", path.join(srcDir, "examples/quickstart_sharegpt.jsonl"));
  await page.waitForSelector("#validate-summary");
  const summary = await page.textContent("#validate-summary");
  if (!/Format sharegpt: \d+ of \d+ rows good/.test(summary)) throw new Error("validate summary: " + summary);
  if (!(await page.textContent("#rows")).includes("conversations")) throw new Error("no first rows shown");
  if ((await page.textContent("#preview")).includes("null")) throw new Error("the preview shows 'null'");
  // The same name again: the page shows the conflict and replaces the file only when asked to.
  allow409 = true;
  await page.setInputFiles("#upload", path.join(srcDir, "examples/quickstart_sharegpt.jsonl"));
  await page.waitForSelector("#upload-conflict");
  allow409 = false;
  await page.click("#upload-replace");
  await waitUntil(page, () => !document.querySelector("#upload-conflict") && !!document.querySelector("#validate-summary"), null,
    "the replaced dataset's preview");
  log("a second upload of the same name asked first, then replaced it");
  // The method field: each preference method's settings show for it alone (hidden for sft).
  const shown = (id) => page.evaluate((i) => !document.getElementById(i).parentElement.hidden, id);
  const expectShown = async (method, want) => {
    await page.selectOption("#set-training-method", method);
    for (const [id, on] of Object.entries(want))
      if ((await shown(id)) !== on) throw new Error(`--method ${method}: ${id} ${on ? "hidden" : "shown"}`);
  };
  const prefIds = ["set-training-beta", "set-training-dpo_loss", "set-training-orpo_lambda", "set-training-simpo_gamma",
    "set-training-kto_desirable_weight", "set-training-reference"];
  const only = (...ids) => Object.fromEntries(prefIds.map((i) => [i, ids.includes(i)]));
  await expectShown("sft", only());
  await expectShown("dpo", only("set-training-beta", "set-training-dpo_loss", "set-training-reference"));
  await expectShown("orpo", only("set-training-orpo_lambda"));
  await expectShown("simpo", only("set-training-beta", "set-training-simpo_gamma"));
  await expectShown("kto", only("set-training-beta", "set-training-kto_desirable_weight", "set-training-reference"));
  await expectShown("sft", only());
  log("the method field shows each method's settings alone");
  await page.fill("#set-training-steps", "100000");
  await page.fill("#set-training-max_seq_length", "256");
  await page.fill("#set-training-eval_every", "4");
  await page.fill("#set-training-batch_size", "4");
  await page.dispatchEvent("#set-training-batch_size", "change");
  await waitUntil(page, (p) => document.querySelector("#plan-verdict")?.textContent !== p, plan1, "the plan to change");
  log("plan updated: " + (await page.textContent("#plan-verdict")));

  // Start, and watch the loss chart gain points while the run trains.
  await page.click("#start");
  await waitUntil(page, () => location.hash.startsWith("#/run/"), null, "the run page");
  runId = decodeURIComponent((await page.evaluate(() => location.hash)).slice(6));
  log("run started: " + runId);
  const points = () => page.evaluate(() => Number(document.querySelector("#loss-chart").getAttribute("data-points")));
  await waitUntil(page, () => Number(document.querySelector("#loss-chart")?.getAttribute("data-points")) >= 3, null, "3 loss points");
  const p1 = await points();
  await waitUntil(page, (n) => Number(document.querySelector("#loss-chart").getAttribute("data-points")) >= n + 2, p1, "more loss points");
  log(`loss chart grew from ${p1} to ${await points()} points while running`);
  // The server ends each event stream after --stream-lifetime-s (3 s here); the page reconnects from
  // its last event id, so the chart keeps growing past it.
  await new Promise((r) => setTimeout(r, 4000));
  const p2 = await points();
  await waitUntil(page, (n) => Number(document.querySelector("#loss-chart").getAttribute("data-points")) >= n + 2, p2,
    "loss points after the stream's lifetime");
  log(`after the first stream ended the chart grew from ${p2} to ${await points()} points`);
  await waitStatus(page, runId, "running");

  // Stop (SIGINT: save and exit), then resume to two steps later.
  await page.click("#stop");
  await waitStatus(page, runId, "interrupted");
  const stopped = await page.evaluate(async (id) => (await (await fetch("/api/runs/" + id)).json()), runId);
  log(`stopped at step ${stopped.steps_done}; checkpoints: ${stopped.checkpoints.length}`);
  if (stopped.checkpoints.length === 0) throw new Error("Stop saved no checkpoint");
  await page.fill("#resume-steps", String(stopped.steps_done + 2));
  await page.click("#resume");
  await waitStatus(page, runId, "finished");
  const done = await page.evaluate(async (id) => (await (await fetch("/api/runs/" + id)).json()), runId);
  if (done.steps_done !== stopped.steps_done + 2) throw new Error(`resumed run ended at step ${done.steps_done}`);
  await page.waitForSelector("#summary-text");
  const summaryText = await page.textContent("#summary-text");
  // The summary says how the frozen base was held: the default, auto, holds a safetensors base in
  // bf16 where `backprop info` says the CPU's bf16 GEMMs run in oneDNN, else in f32.
  const gemm = JSON.parse(execFileSync(exe, ["info", "--json"], { stdio: ["ignore", "pipe", "ignore"] }).toString()).cpu_gemm;
  const heldAs = gemm.held_bf16 === "bf16-onednn" ? "bf16" : "f32";
  if (!summaryText.includes("frozen base auto → " + heldAs))
    throw new Error(`summary without the base dtype (auto → ${heldAs} expected): ` + summaryText);
  log(`resumed and finished at step ${done.steps_done}`);

  // `backprop eval` on the finished run: its page lists each metric with its interval, and the gates.
  execFileSync(exe, ["eval", done.path, "--eval-data", path.join(srcDir, "examples/quickstart_sharegpt_holdout.jsonl"),
    "--metric", "exact_match,loss", "--gate", "loss<1000", "--resamples", "200", "--max-examples", "10"], { stdio: "pipe" });
  await page.reload();
  await page.waitForSelector("#eval-results");
  const evalRows = await page.$$eval("#eval-results tr", (trs) => trs.map((tr) => tr.textContent));
  if (!evalRows.some((t) => /^exact_match\d/.test(t)) || !evalRows.some((t) => /^loss\d[\d.]* \[[\d.]+, [\d.]+\]$/.test(t)))
    throw new Error("eval results rows: " + JSON.stringify(evalRows));
  const gateText = await page.textContent("#eval-gates");
  if (!gateText.includes("loss<1000: passed")) throw new Error("eval gates: " + gateText);
  log("eval results on the run page: " + evalRows.slice(1).join(" | "));

  // Export a GGUF (q8_0) and see the resulting path.
  // The export form offers exactly the formats `backprop export --format` takes (one registry row).
  const offered = await page.$$eval("#export-format option", (os) => os.map((o) => o.value).sort().join("|"));
  if (offered !== "gguf|gguf-lora|lora|merged") throw new Error("export formats offered: " + offered);
  await page.selectOption("#export-format", "gguf");
  await page.selectOption("#export-quant", "q8_0");
  await page.click("#export");
  await page.waitForSelector(".export-line.ok");
  const exported = await page.textContent(".export-line.ok");
  const gguf = (exported.match(/done: (\S+\.gguf)/) || [])[1];
  if (!gguf || !fs.existsSync(gguf)) throw new Error("no GGUF written: " + exported);
  log("exported " + gguf);

  // A DPO run from the form: the run page draws its reward accuracy and margin, train and held-out.
  await page.click("#nav-new");
  await page.waitForSelector("#set-training-steps");
  await page.fill("#model", path.join(srcDir, "models/tiny-chat"));
  await page.dispatchEvent("#model", "change");
  await page.setInputFiles("#upload", path.join(srcDir, "examples/preference/pairs.jsonl"));
  await page.waitForSelector("#validate-summary");
  await page.selectOption("#set-training-method", "dpo");
  await page.fill("#set-training-steps", "6");
  await page.fill("#set-training-batch_size", "4");
  await page.fill("#set-training-max_seq_length", "256");
  await page.fill("#set-training-eval_every", "3");
  await page.fill("#set-data-holdout", "0.1");
  await page.click("#start");
  await waitUntil(page, (prev) => location.hash.startsWith("#/run/") && location.hash !== prev, "#/run/" + runId,
    "the DPO run's page");
  const dpoId = decodeURIComponent((await page.evaluate(() => location.hash)).slice(6));
  await waitStatus(page, dpoId, "finished");
  const chartPoints = (id) => page.evaluate((i) => Number(document.getElementById(i)?.getAttribute("data-points") || 0), id);
  await waitUntil(page, () => Number(document.querySelector("#reward-accuracy-chart")?.getAttribute("data-points")) >= 6 + 3,
    null, "6 train and 3 eval reward points");
  const dpoSummary = await page.evaluate(async (id) => (await (await fetch("/api/runs/" + id)).json()), dpoId);
  if (dpoSummary.method !== undefined && dpoSummary.method !== "dpo") throw new Error("run method: " + dpoSummary.method);
  log(`DPO run ${dpoId}: reward accuracy ${await chartPoints("reward-accuracy-chart")} points, margin ` +
    `${await chartPoints("reward-margin-chart")} points`);

  await page.evaluate(() => window.scrollTo(0, 0));
  await page.screenshot({ path: shot, fullPage: true });
  log("screenshot " + shot);
  // System page: real numbers or "not available", never a placeholder.
  await page.click("#nav-system");
  await page.waitForSelector("#ram");
  const ram = await page.textContent("#ram");
  if (!/\d[\d.]* [KMGT]iB used of \d[\d.]* [KMGT]iB/.test(ram)) throw new Error("RAM reading: " + ram);
  // Keyboard only: Tab reaches the main links and Enter follows one. The router focuses <main> once
  // a view is drawn, after the view's elements appear: wait for that first, or it can take the focus
  // back between the key presses (under load it did, and the Enter went nowhere).
  await waitUntil(page, () => document.activeElement?.id === "main", null, "the System view's focus on <main>");
  await page.focus("#nav-system");
  await page.keyboard.press("Shift+Tab");
  await page.keyboard.press("Shift+Tab");
  await waitUntil(page, () => document.activeElement?.id === "nav-runs", null, "Shift+Tab twice from System to Runs");
  await page.keyboard.press("Enter");
  await page.waitForSelector("#runs-table");
  // A phone-sized window: the runs list, kept as a second artifact.
  await page.setViewportSize({ width: 390, height: 844 });
  await page.screenshot({ path: shot.replace(/\.png$/, "_phone.png"), fullPage: true });
  log("system page, keyboard navigation and phone layout checked");
  if (problems.length) throw new Error("console problems:\n" + problems.join("\n"));
  log("PASS");
} catch (e) {
  console.error("FAIL: " + (e && e.stack || e));
  if (problems.length) console.error(problems.join("\n"));
  process.exitCode = 1;
} finally {
  if (browser) await browser.close();
  if (runId) {  // a failure must not leave the 100000-step run training: Stop it (no-op when it ended)
    await fetch(`${base}/api/runs/${runId}/stop`, { method: "POST",
      headers: { Authorization: "Basic " + Buffer.from("tester:browser pass").toString("base64") } }).catch(() => {});
  }
  ui.kill("SIGINT");
}

// backprop ui page script: a small hash router over four views (runs, new run, run, system).
// Everything is built with DOM calls (never innerHTML with data), so run names, log lines and
// dataset rows cannot inject markup; the CSP forbids inline scripts anyway.
"use strict";
(function () {
  const main = document.getElementById("main");
  let cleanup = [];

  function h(tag, attrs, ...children) {
    const e = document.createElement(tag);
    for (const k in attrs || {}) {
      if (k.startsWith("on")) e.addEventListener(k.slice(2), attrs[k]);
      else if (k === "text") e.textContent = attrs[k];
      else if (attrs[k] !== undefined && attrs[k] !== null && attrs[k] !== false) e.setAttribute(k, attrs[k]);
    }
    for (const c of children.flat()) if (c !== null && c !== undefined) e.appendChild(typeof c === "string" ? document.createTextNode(c) : c);
    return e;
  }
  async function api(method, path, body, raw) {
    const opts = { method, headers: {} };
    if (body !== undefined) {
      opts.body = raw ? body : JSON.stringify(body);
      if (!raw) opts.headers["Content-Type"] = "application/json";
    }
    const res = await fetch(path, opts);
    if (res.status === 401) { location.href = "/login"; throw new Error("not logged in"); }
    const type = res.headers.get("Content-Type") || "";
    const data = type.includes("json") ? await res.json() : await res.text();
    if (!res.ok) { const e = new Error(data.message || String(data)); e.data = data; e.status = res.status; throw e; }
    return data;
  }
  const bytes = (n) => {
    if (n === null || n === undefined) return "not available";
    const u = ["bytes", "KiB", "MiB", "GiB", "TiB"];
    let i = 0;
    while (n >= 1024 && i < u.length - 1) { n /= 1024; i++; }
    return (i === 0 ? n : n.toFixed(2)) + " " + u[i];
  };
  const num = (v, d) => (typeof v === "number" ? v.toFixed(d === undefined ? 4 : d) : "–");
  const statusCell = (r) => h("span", { class: "status status-" + r.status, text: r.status + (r.error_code ? " (" + r.error_code + ")" : "") });
  const errorBox = () => h("p", { class: "error", role: "alert" });
  async function pollLaunch(id, onDone, onProgress) {
    for (;;) {
      const l = await api("GET", "/api/launches/" + id);
      if (onProgress) onProgress(l);
      if (!l.running) return onDone(l);
      await new Promise((r) => setTimeout(r, 700));
    }
  }

  // ---- runs ------------------------------------------------------------------------------------
  async function viewRuns() {
    main.append(h("h1", { text: "Runs" }));
    const body = h("tbody");
    main.append(h("div", { class: "card table-wrap" }, h("table", { id: "runs-table" },
      h("thead", {}, h("tr", {}, ["Run", "Status", "Model", "Data", "Steps", "Best eval loss"].map((t) => h("th", { scope: "col", text: t })))), body)));
    const runs = await api("GET", "/api/runs");
    if (runs.length === 0) body.append(h("tr", {}, h("td", { colspan: 6, class: "muted", text: "No runs yet: start one under New run." })));
    for (const r of runs)
      body.append(h("tr", {},
        h("td", {}, h("a", { href: "#/run/" + encodeURIComponent(r.id), text: r.id.slice(0, 8) })),
        h("td", {}, statusCell(r)), h("td", { class: "path", text: r.model || "" }), h("td", { class: "path", text: (r.data || "").split("/").pop() }),
        h("td", { text: r.steps_done + (r.steps_total ? " / " + r.steps_total : "") }), h("td", { text: num(r.best_eval_loss) })));
  }

  // ---- new run ---------------------------------------------------------------------------------
  async function viewNew() {
    main.append(h("h1", { text: "New run" }));
    const err = errorBox();
    const model = h("input", { id: "model", name: "model", placeholder: "models/tiny-chat", "aria-describedby": "model-help" });
    const datasetSel = h("select", { id: "dataset", name: "dataset" });
    const upload = h("input", { id: "upload", type: "file", accept: ".jsonl,.json,.txt" });
    const preview = h("div", { id: "preview" });
    const conflict = h("div", { id: "upload-conflict-box" });
    const plan = h("div", { id: "plan", class: "card plan" }, h("span", { class: "muted", text: "Memory plan: choose a model." }));
    const fields = {};
    let planSeq = 0;  // only the newest plan request may draw (answers can arrive out of order)
    const settingsBox = h("div", { class: "settings-grid" });
    main.append(
      h("div", { class: "card" },
        h("label", { for: "model", text: "Model folder" }),
        h("span", { class: "help", id: "model-help", text: "A local Hugging Face folder (config.json, *.safetensors, tokenizer files)." }), model,
        h("label", { for: "dataset", text: "Dataset" }),
        h("span", { class: "help", text: "Pick a file from the dataset folder, or upload one (JSONL, JSON or .txt)." }),
        h("div", { class: "row" }, datasetSel, h("label", { for: "upload", class: "sr", text: "Upload" }), upload), conflict, preview),
      h("h2", { text: "Settings" }), h("div", { class: "card" }, settingsBox),
      h("h2", { text: "Memory plan" }), plan, err,
      h("button", { id: "start", type: "button", onclick: start }, "Start training"));

    async function loadDatasets(select) {
      const list = await api("GET", "/api/datasets");
      datasetSel.replaceChildren(h("option", { value: "", text: "— choose —" }), ...list.map((d) => h("option", { value: d.name, text: d.name + " (" + bytes(d.bytes) + ")" })));
      if (select) datasetSel.value = select;
    }
    async function showPreview() {
      preview.replaceChildren();
      if (!datasetSel.value) return;
      try {
        const p = await api("GET", "/api/datasets/" + encodeURIComponent(datasetSel.value) + "/preview");
        const v = p.validate;
        preview.append(...[
          h("p", { id: "validate-summary", class: v.valid ? "ok" : "error",
            text: `Format ${v.format}: ${v.good_rows} of ${v.total_rows} rows good, ${v.bad_rows} bad, ${v.long_rows} over the length limit.` }),
          (v.issues || []).length ? h("ul", {}, v.issues.map((i) => h("li", { text: `line ${i.line}: ${i.problem} ${i.detail || i.message || ""}` }))) : null,
          h("p", { class: "muted", text: "First rows:" }), h("pre", { id: "rows" }, p.rows.join("\n"))].filter(Boolean));
      } catch (e) { preview.append(h("p", { class: "error", text: e.message })); }
    }
    datasetSel.addEventListener("change", showPreview);
    // An upload never replaces a dataset silently: the server answers 409 for a name that exists,
    // and the page offers another name or an explicit Replace (?overwrite=1).
    async function sendDataset(file, name, overwrite) {
      err.textContent = "";
      conflict.replaceChildren();
      try {
        await api("PUT", "/api/datasets/" + encodeURIComponent(name) + (overwrite ? "?overwrite=1" : ""), file, true);
        await loadDatasets(name);
        await showPreview();
      } catch (e) {
        if (e.status === 409) showConflict(file, name);
        else err.textContent = e.message;
      }
    }
    function showConflict(file, name) {
      const dot = name.lastIndexOf(".");
      const other = h("input", { id: "upload-name", "aria-label": "Another name for the upload" });
      other.value = name.slice(0, dot) + "-2" + name.slice(dot);
      conflict.append(
        h("p", { class: "error", role: "alert", id: "upload-conflict", text: "A dataset named " + name + " already exists; nothing was changed." }),
        h("div", { class: "row" }, other,
          h("button", { type: "button", id: "upload-rename", onclick: () => sendDataset(file, other.value.trim(), false) }, "Upload under this name"),
          h("button", { type: "button", id: "upload-replace", onclick: () => sendDataset(file, name, true) }, "Replace " + name)));
    }
    upload.addEventListener("change", () => {
      const f = upload.files[0];
      upload.value = "";  // picking the same file again must fire "change" again
      if (f) sendDataset(f, f.name, false);
    });

    const settings = await api("GET", "/api/settings");
    const methodRows = [];
    for (const s of settings) {
      const id = "set-" + s.key.replace(".", "-");
      const input = s.choices
        ? h("select", { id, name: s.key }, s.choices.split("|").map((c) => h("option", { value: c, text: c })))
        : h("input", { id, name: s.key, "aria-describedby": id + "-help" });
      input.value = s.default;
      fields[s.key] = input;
      input.addEventListener("change", refreshPlan);
      const row = h("div", {}, h("label", { for: id, text: s.flag + "  (" + s.key + ")" }), input,
        h("span", { class: "help", id: id + "-help", text: s.help + " [" + s.allowed + "]" }));
      if (s.methods) methodRows.push([row, s.methods]);
      settingsBox.append(row);
    }
    // A preference method's settings show for the methods that read them only (the server sends
    // the chosen method's alone).
    function showMethodSettings() {
      const m = fields["training.method"] ? fields["training.method"].value : "sft";
      for (const [row, methods] of methodRows) row.hidden = !methods.includes(m);
    }
    if (fields["training.method"]) fields["training.method"].addEventListener("change", showMethodSettings);
    showMethodSettings();
    model.addEventListener("change", refreshPlan);
    await loadDatasets();

    function formSettings() {
      const out = {};
      for (const k in fields) out[k] = fields[k].value;
      return out;
    }
    async function refreshPlan() {
      if (!model.value) return;
      const seq = ++planSeq;
      try {
        const p = await api("POST", "/api/estimate", { model: model.value, settings: formSettings() });
        if (seq !== planSeq) return;
        const rows = [["weights", p.plan.weights], ["trainable", p.plan.trainable], ["gradients", p.plan.gradients],
          ["optimizer state", p.plan.optimizer_state],
          ...(p.plan.gemm_workspace ? [["GEMM workspace (cuBLASLt)", p.plan.gemm_workspace]] : []),
          ["saved activations", p.plan.saved_activations], ["workspace", p.plan.workspace], ["total", p.plan.total]];
        plan.replaceChildren(
          h("p", { id: "plan-verdict", class: p.fits ? "ok" : "error",
            text: (p.fits ? "Fits: " : "Does not fit: ") + bytes(p.plan.total) + " of " + bytes(p.limit_bytes) + " (" + p.limit_source + ")" }),
          h("table", {}, h("tbody", {}, rows.map((r) => h("tr", {}, h("td", { text: r[0] }), h("td", { text: bytes(r[1]) }))))));
      } catch (e) { if (seq === planSeq) plan.replaceChildren(h("p", { class: "error", text: e.message })); }
    }

    async function start() {
      err.textContent = "";
      const btn = document.getElementById("start");
      btn.disabled = true;
      try {
        const r = await api("POST", "/api/runs", { model: model.value, dataset: datasetSel.value, settings: formSettings() });
        await pollLaunch(r.launch_id, (l) => {
          if (l.run_id) location.hash = "#/run/" + l.run_id;
          else { err.textContent = "The run did not start: " + ((l.result && l.result.message) || "see the log"); btn.disabled = false; }
        }, (l) => { if (l.run_id && l.running) location.hash = "#/run/" + l.run_id; });
      } catch (e) { err.textContent = e.message; btn.disabled = false; }
    }
  }
  window.BpApp = { h, api, bytes, num, statusCell, errorBox, pollLaunch, main: () => main, onCleanup: (f) => cleanup.push(f) };

  // ---- system ----------------------------------------------------------------------------------
  async function viewSystem() {
    main.append(h("h1", { text: "System" }));
    const s = await api("GET", "/api/system");
    const gpuRows = s.gpus.length
      ? s.gpus.map((g) => h("tr", {}, h("th", { scope: "row", text: "GPU " + g.index }),
          h("td", { text: `${g.name}: ${bytes(g.bytes_total - g.bytes_free)} used of ${bytes(g.bytes_total)}; temperature ${g.temperature_c === null ? "not available" : g.temperature_c + " °C"}` })))
      : [h("tr", {}, h("th", { scope: "row", text: "GPU" }), h("td", { id: "gpu", text: "not available (" + s.gpu_unavailable_reason + ")" }))];
    main.append(h("div", { class: "card" }, h("table", { id: "system-table" }, h("tbody", {},
      h("tr", {}, h("th", { scope: "row", text: "CPU" }), h("td", { text: `${s.cpu.model}, ${s.cpu.logical_cores} threads` + (s.cpu.physical_cores ? `, ${s.cpu.physical_cores} cores` : "") })),
      h("tr", {}, h("th", { scope: "row", text: "RAM" }), h("td", { id: "ram", text: `${bytes(s.ram.bytes_total - s.ram.bytes_available)} used of ${bytes(s.ram.bytes_total)} (${bytes(s.ram.bytes_available)} available)` })),
      h("tr", {}, h("th", { scope: "row", text: "Memory limit" }), h("td", { id: "cgroup", text: s.cgroup ? `cgroup: ${bytes(s.cgroup.bytes_current)} used of ${bytes(s.cgroup.bytes_max)}` : "no cgroup limit" })),
      h("tr", {}, h("th", { scope: "row", text: "CPU temperature" }), h("td", { id: "cpu-temp", text: s.temperatures.length ? s.temperatures.map((t) => `${t.sensor} ${t.celsius.toFixed(0)} °C`).join(", ") : "not available (no hwmon or thermal-zone sensor)" })),
      gpuRows))));
  }

  async function route() {
    cleanup.forEach((f) => f());
    cleanup = [];
    main.replaceChildren();
    const hash = location.hash || "#/runs";
    for (const a of document.querySelectorAll("nav a")) a.classList.toggle("active", hash.startsWith(a.getAttribute("href")));
    try {
      if (hash.startsWith("#/run/")) await window.BpRunView(decodeURIComponent(hash.slice(6)));
      else if (hash === "#/new") await viewNew();
      else if (hash === "#/system") await viewSystem();
      else await viewRuns();
    } catch (e) { main.append(h("p", { class: "error", role: "alert", text: e.message })); }
    main.focus();
  }
  window.addEventListener("hashchange", route);
  window.addEventListener("DOMContentLoaded", route);
})();

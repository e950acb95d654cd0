// backprop ui: the run page. Live charts from the run's server-sent events (its metrics.jsonl),
// the log tail, checkpoints, the summary, and Stop / Resume / Export with their progress.
"use strict";
(function () {
  window.BpRunView = async function (id) {
    const { h, api, bytes, num, statusCell, errorBox, pollLaunch, onCleanup } = window.BpApp;
    const main = window.BpApp.main();
    const enc = encodeURIComponent(id);
    const head = h("div", { class: "card", id: "run-head" });
    const err = errorBox();
    const charts = h("div", { class: "grid", id: "charts" });
    const logPre = h("pre", { id: "log", tabindex: "0", "aria-label": "Log" });
    const cps = h("ul", { id: "checkpoints" });
    const summary = h("div", { id: "summary" });
    const evalBox = h("div", { id: "eval-results-box" });
    const exportsBox = h("div", { id: "exports" });
    const resumeSteps = h("input", { id: "resume-steps", inputmode: "numeric", placeholder: "same as before", size: 10 });
    // Export choices: the registry rows of export.format and export.quantization (default first).
    const exportSettings = await api("GET", "/api/export-settings");
    const choiceSelect = (id, key) => {
      const s = exportSettings.find((x) => x.key === key);
      const values = s.choices.split("|").sort((a, b) => (b === s.default) - (a === s.default));
      return h("select", { id }, values.map((v) => h("option", { value: v, text: v })));
    };
    const fmtSel = choiceSelect("export-format", "export.format");
    const quantSel = choiceSelect("export-quant", "export.quantization");
    const ollama = h("input", { id: "export-ollama", type: "checkbox" });
    const stopBtn = h("button", { id: "stop", type: "button", onclick: stop }, "Stop (save and exit)");
    const resumeBtn = h("button", { id: "resume", type: "button", class: "secondary", onclick: resume }, "Resume");
    const exportBtn = h("button", { id: "export", type: "button", class: "secondary", onclick: doExport }, "Export");
    main.append(h("h1", { text: "Run " + id }), head, err,
      h("div", { class: "card row" }, stopBtn,
        h("span", {}, h("label", { for: "resume-steps", text: "Train until step" }), resumeSteps), resumeBtn),
      h("div", { class: "card row" }, h("span", {}, h("label", { for: "export-format", text: "Export format" }), fmtSel),
        h("span", {}, h("label", { for: "export-quant", text: "GGUF quantization" }), quantSel),
        h("span", {}, h("label", { for: "export-ollama", text: "Register with Ollama" }), ollama), exportBtn),
      exportsBox, charts, h("h2", { text: "Summary" }), summary, evalBox, h("h2", { text: "Checkpoints" }), cps,
      h("h2", { text: "Log" }), logPre);

    const C = window.BpChart;
    const loss = C.create(charts, "Loss", ["train", "eval"]);
    const lr = C.create(charts, "Learning rate", ["lr"]);
    const tps = C.create(charts, "Tokens/s", ["tokens/s"], (v) => v.toFixed(0));
    const mem = C.create(charts, "Memory in use", ["bytes"], (v) => bytes(v));
    charts.querySelectorAll("svg")[0].id = "loss-chart";
    // A preference run's records carry TRL's reward metrics: two more charts, made on the first such
    // record (train from step records, eval from eval records' eval_-prefixed keys).
    let rewards = null;
    function rewardCharts() {
      if (!rewards) {
        rewards = {
          acc: C.create(charts, "Reward accuracy", ["train", "eval"], (v) => v.toFixed(2)),
          margin: C.create(charts, "Reward margin", ["train", "eval"]),
        };
        const svgs = charts.querySelectorAll("svg");
        svgs[svgs.length - 2].id = "reward-accuracy-chart";
        svgs[svgs.length - 1].id = "reward-margin-chart";
      }
      return rewards;
    }
    function addRewards(series, step, r, prefix) {
      const acc = r[prefix + "rewards/accuracies"], margin = r[prefix + "rewards/margins"];
      if (typeof acc !== "number" && typeof margin !== "number") return;
      const c = rewardCharts();
      if (typeof acc === "number") c.acc.add(series, step, acc);
      if (typeof margin === "number") c.margin.add(series, step, margin);
    }
    let prev = null;
    function onMetrics(records) {
      for (const r of records) {
        if (r.type === "step") {
          addRewards(0, r.step, r, "");
          loss.add(0, r.step, r.loss);
          lr.add(0, r.step, r.lr);
          mem.add(0, r.step, r.bytes_in_use);
          if (prev && r.step === prev.step + 1 && r.time > prev.time) tps.add(0, r.step, r.tokens / (r.time - prev.time));
          prev = r;
        } else if (r.type === "eval") {
          loss.add(1, r.step, r.eval_loss);
          addRewards(1, r.step, r, "eval_");
        }
      }
    }
    function onStatus(d) {
      head.replaceChildren(
        h("p", {}, "Status: ", statusCell(d), d.pid ? " (pid " + d.pid + ")" : ""),
        h("p", { text: `Model ${d.model || "?"} · data ${d.data || "?"} · step ${d.steps_done}${d.steps_total ? " of " + d.steps_total : ""} · best eval loss ${num(d.best_eval_loss)}` }));
      head.dataset.status = d.status;
      stopBtn.disabled = d.status !== "running";
      resumeBtn.disabled = d.status === "running" || d.status === "finished" && !resumeSteps.value;
      cps.replaceChildren(...(d.checkpoints.length ? d.checkpoints.map((c) => h("li", { text: c })) : [h("li", { class: "muted", text: "none yet" })]));
      const s = d.summary;
      summary.replaceChildren(s && s.run_id
        ? h("p", { id: "summary-text", text: `${s.steps} steps, ${s.tokens} tokens in ${num(s.seconds, 1)} s${s.world_size > 1 ? " on " + s.world_size + " processes (data-parallel)" : ""}; final loss ${num(s.final_loss)}, best eval loss ${num(s.best_eval_loss)}; peak memory ${bytes(s.peak_memory_bytes)}${s.base_dtype ? "; frozen base " + s.base_dtype : ""}; result ${s.final_artifact}` })
        : h("p", { class: "muted", text: "The run has not finished." }));
      evalBox.replaceChildren(...evalResults(d.eval_results));
      exportsBox.replaceChildren(...d.exports.map(exportLine));
    }
    // `backprop eval`'s last results for this run (its eval_results.json): each metric with its 95%
    // bootstrap interval, the paired difference against --vs, and the gates.
    function evalResults(r) {
      if (!r || typeof r.metrics !== "object" || !r.metrics) return [];
      const diff = r.difference || {}, vs = (r.vs && r.vs.metrics) || {};
      const ci = (e) => e && typeof e.value === "number" ? `${num(e.value)} [${num(e.ci_low)}, ${num(e.ci_high)}]` : "";
      const hasVs = Object.keys(vs).length > 0;
      const rows = Object.entries(r.metrics).map(([k, e]) => h("tr", {}, h("td", { text: k }), h("td", { text: ci(e) }),
        ...(hasVs ? [h("td", { text: ci(vs[k]) }), h("td", { text: ci(diff[k]) })] : [])));
      const gates = (r.gates || []).map((g) => h("li", { class: g.passed ? "" : "bad", text: `${g.gate}: ${g.passed ? "passed" : "FAILED"}` }));
      return [h("h2", { text: "Evaluation (backprop eval)" }),
        h("p", { class: "muted", text: `${r.examples} examples of ${r.eval_data}; 95% bootstrap intervals, ${r.resamples} resamples` }),
        h("table", { id: "eval-results" }, h("tr", {}, h("th", { text: "metric" }), h("th", { text: r.evaluated || "this run" }),
          ...(hasVs ? [h("th", { text: "vs " + r.vs.evaluated }), h("th", { text: "difference" })] : [])), ...rows),
        ...(gates.length ? [h("ul", { id: "eval-gates" }, ...gates)] : [])];
    }
    function exportLine(l) {
      const argv = (l.argv || []).join(" ");
      let text = l.running ? "exporting… " : "";
      if (!l.running && l.result) {
        const r = l.result;
        text += r.code ? "failed: " + r.code + " " + r.message
          : "done: " + r.output + " (" + bytes(r.bytes) + ")" + (r.ollama ? ", Ollama model " + r.ollama.model : "") + (r.next ? "; next: " + r.next.join(" · ") : "");
      }
      return h("p", { class: "export-line" + (l.result && !l.result.code && !l.running ? " ok" : ""), text: argv.split(" ").slice(1, 6).join(" ") + " → " + text });
    }

    // The server ends each stream after a minute, and refuses one past its limit of open streams
    // (429/503): open a new one a little later, from the metrics offset the last event named.
    let es = null, offset = 0, reconnect = null;
    function connect() {
      es = new EventSource("/api/runs/" + enc + "/events?from=" + offset);
      es.addEventListener("metrics", (e) => { if (e.lastEventId) offset = Number(e.lastEventId); onMetrics(JSON.parse(e.data)); });
      es.addEventListener("status", (e) => onStatus(JSON.parse(e.data)));
      es.onerror = () => { es.close(); clearTimeout(reconnect); reconnect = setTimeout(connect, 2000); };
    }
    connect();
    onCleanup(() => { clearTimeout(reconnect); es.close(); });
    async function refreshLog() {
      try {
        const t = await api("GET", "/api/runs/" + enc + "/log");
        const atEnd = logPre.scrollTop + logPre.clientHeight >= logPre.scrollHeight - 4;
        logPre.textContent = t || "(no log: runs started from the command line log to their terminal)";
        if (atEnd) logPre.scrollTop = logPre.scrollHeight;
      } catch (e) { /* shown by the next successful refresh */ }
    }
    refreshLog();
    const timer = setInterval(refreshLog, 2000);
    onCleanup(() => clearInterval(timer));

    async function stop() {
      err.textContent = "";
      try {
        const r = await api("POST", "/api/runs/" + enc + "/stop");
        if (!r.stopped) err.textContent = "Not stopped: " + r.reason;
      } catch (e) { err.textContent = e.message; }
    }
    async function resume() {
      err.textContent = "";
      try {
        const steps = parseInt(resumeSteps.value, 10);
        const r = await api("POST", "/api/runs/" + enc + "/resume", steps > 0 ? { steps } : {});
        resumeBtn.disabled = true;
        pollLaunch(r.launch_id, (l) => { if (l.result && l.result.code && l.result.code !== "RUNTIME_TRAINING_ABORTED") err.textContent = l.result.code + ": " + l.result.message; });
      } catch (e) { err.textContent = e.message; }
    }
    async function doExport() {
      err.textContent = "";
      try {
        await api("POST", "/api/runs/" + enc + "/export", { format: fmtSel.value, quantization: quantSel.value, ollama: ollama.checked });
      } catch (e) { err.textContent = e.message; }
    }
  };
})();

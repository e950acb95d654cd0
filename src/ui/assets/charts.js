// Hand-written SVG line charts for the run page (no library, no inline styles: CSP-safe).
// BpChart.create(parent, title, ["train", "eval"], format) -> chart; chart.add(series, x, y).
"use strict";
(function () {
  const NS = "http://www.w3.org/2000/svg";
  const COLORS = ["#2457c5", "#d2691e"];
  const W = 600, H = 200, L = 58, R = 10, T = 10, B = 24;

  function el(name, attrs, parent) {
    const e = document.createElementNS(NS, name);
    for (const k in attrs) e.setAttribute(k, attrs[k]);
    if (parent) parent.appendChild(e);
    return e;
  }

  function create(parent, title, names, format) {
    const box = document.createElement("div");
    box.className = "card chart";
    const head = document.createElement("div");
    head.className = "title";
    head.textContent = title;
    box.appendChild(head);
    const legend = document.createElement("div");
    legend.className = "legend";
    names.forEach((n, i) => {
      const s = document.createElement("span");
      s.className = i === 0 ? "swatch-a" : "swatch-b";
      s.textContent = "\u25A0 " + n;
      legend.appendChild(s);
    });
    if (names.length > 1) box.appendChild(legend);
    const svg = el("svg", { viewBox: `0 0 ${W} ${H}`, role: "img", "aria-label": title, "data-points": "0" }, box);
    parent.appendChild(box);
    const series = names.map(() => []);
    let pending = false;
    const fmt = format || ((v) => (Math.abs(v) >= 1000 || (Math.abs(v) < 0.01 && v !== 0) ? v.toExponential(2) : v.toFixed(3)));

    function draw() {
      pending = false;
      while (svg.firstChild) svg.removeChild(svg.firstChild);
      const all = series.flat();
      svg.setAttribute("data-points", String(all.length));
      el("rect", { x: L, y: T, width: W - L - R, height: H - T - B, fill: "none", stroke: "#d9dde4" }, svg);
      if (all.length === 0) {
        const t = el("text", { x: W / 2, y: H / 2, "text-anchor": "middle", fill: "#5d6575", "font-size": 13 }, svg);
        t.textContent = "no data yet";
        return;
      }
      let x0 = Math.min(...all.map((p) => p[0])), x1 = Math.max(...all.map((p) => p[0]));
      let y0 = Math.min(...all.map((p) => p[1])), y1 = Math.max(...all.map((p) => p[1]));
      if (x1 === x0) x1 = x0 + 1;
      if (y1 === y0) { y1 += Math.abs(y1) * 0.05 || 1; y0 -= Math.abs(y0) * 0.05 || 1; }
      const sx = (x) => L + ((x - x0) / (x1 - x0)) * (W - L - R);
      const sy = (y) => H - B - ((y - y0) / (y1 - y0)) * (H - T - B);
      const label = (x, y, text, anchor) => {
        const t = el("text", { x, y, "text-anchor": anchor, fill: "#5d6575", "font-size": 11 }, svg);
        t.textContent = text;
      };
      label(L - 4, T + 10, fmt(y1), "end");
      label(L - 4, H - B, fmt(y0), "end");
      label(L, H - 6, "step " + x0, "start");
      label(W - R, H - 6, "step " + x1, "end");
      series.forEach((pts, i) => {
        if (pts.length === 0) return;
        const d = pts.map((p) => `${sx(p[0]).toFixed(1)},${sy(p[1]).toFixed(1)}`).join(" ");
        el("polyline", { points: d, fill: "none", stroke: COLORS[i % 2], "stroke-width": 2 }, svg);
        if (pts.length < 60) pts.forEach((p) => el("circle", { cx: sx(p[0]), cy: sy(p[1]), r: 2.5, fill: COLORS[i % 2] }, svg));
      });
    }

    draw();
    return {
      add(i, x, y) {
        if (typeof y !== "number" || !isFinite(y)) return;
        series[i].push([x, y]);
        if (!pending) { pending = true; requestAnimationFrame(draw); }
      },
      clear() { series.forEach((s) => (s.length = 0)); draw(); },
      count() { return series.reduce((n, s) => n + s.length, 0); },
    };
  }
  window.BpChart = { create };
})();

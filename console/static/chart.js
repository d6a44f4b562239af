// Small time-series charts as inline SVG, drawn from data with no library:
// an axis-free line over the last minutes, with its latest value and peak
// in words (the chart is an image; its label carries the numbers).

const NS = "http://www.w3.org/2000/svg";
const W = 300;
const H = 64;

function svg(tag, attrs) {
  const e = document.createElementNS(NS, tag);
  for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, String(v));
  return e;
}

// chart returns a <figure> for values (oldest first), spaced stepMs apart;
// format turns a value into words.
export function chart(title, values, { stepMs = 5000, format = (v) => v.toFixed(1) } = {}) {
  const fig = document.createElement("figure");
  fig.className = "chart";
  const peak = values.length ? Math.max(...values) : 0;
  const last = values.length ? values[values.length - 1] : 0;
  const minutes = Math.round((values.length * stepMs) / 60000);
  const summary = values.length
    ? `${title}: now ${format(last)}, peak ${format(peak)} over the last ${minutes || "<1"} min`
    : `${title}: no samples yet`;
  const box = svg("svg", { viewBox: `0 0 ${W} ${H}`, role: "img", "aria-label": summary, preserveAspectRatio: "none" });
  box.append(svg("rect", { x: 0, y: 0, width: W, height: H, class: "chart-bg" }));
  if (values.length > 1) {
    const top = peak > 0 ? peak : 1;
    const dx = W / (values.length - 1);
    const pts = values.map((v, i) => `${(i * dx).toFixed(1)},${(H - 2 - (v / top) * (H - 6)).toFixed(1)}`);
    box.append(svg("polygon", { points: `0,${H} ${pts.join(" ")} ${W},${H}`, class: "chart-area" }));
    box.append(svg("polyline", { points: pts.join(" "), class: "chart-line" }));
  }
  const cap = document.createElement("figcaption");
  cap.textContent = summary;
  fig.append(box, cap);
  return fig;
}

// sumAligned adds series that end at the same moment, aligned on their
// newest point (nodes sample on their own clocks, a few seconds apart at
// most: good enough for a picture).
export function sumAligned(columns) {
  const n = Math.max(0, ...columns.map((c) => c.length));
  const out = new Array(n).fill(0);
  for (const c of columns) {
    for (let i = 0; i < c.length; i++) out[n - c.length + i] += c[i];
  }
  return out;
}

// The dashboard's charts (widgets/plot.py): one ES module for two kinds of model.
// - The plotly.js model (`source`: plotly.min.js as gzip bytes) loads plotly.js ONCE per page, in `initialize`,
//   without awaiting it: anywidget gives a model 2 s to initialize and fails it after that ("[anywidget] Failed to
//   initialize model"), which is what left plotly's own FigureWidget (a 4.9 MB module per chart) empty.
// - A chart model (`figure`: its traces and layout, arrays as binary float64) is drawn from its synced state on
//   every render, so a view that renders late (Voila renders after the kernel ran the page, a reload, a viewer)
//   draws the newest data; each change of `figure` redraws it with Plotly.react.
// While a chart is shown it tells the kernel so every few seconds (with the revision it drew): the kernel's update
// loop pauses when no page shows it, and re-sends the state a view missed (a dropped connection).
const HEARTBEAT_MS = 5000;
const SLOT = "__verlWorkbenchPlotly";

function plotlySlot() {
  let slot = globalThis[SLOT];
  if (!slot) {
    let resolve;
    slot = { loading: false, promise: new Promise((r) => { resolve = r; }) };
    slot.resolve = resolve;
    globalThis[SLOT] = slot;
  }
  return slot;
}

function bytesOf(value) {
  if (value instanceof DataView) return new Uint8Array(value.buffer, value.byteOffset, value.byteLength);
  if (value instanceof ArrayBuffer) return new Uint8Array(value);
  if (ArrayBuffer.isView(value)) return new Uint8Array(value.buffer, value.byteOffset, value.byteLength);
  return null;
}

async function loadPlotly(source) {
  const stream = new Blob([bytesOf(source)]).stream().pipeThrough(new DecompressionStream("gzip"));
  const text = await new Response(stream).text();
  const module = { exports: {} };
  // plotly.min.js is UMD: given a CommonJS `module` it returns Plotly there (and sets window.Plotly).
  new Function("module", "exports", text)(module, module.exports);
  return module.exports;
}

// {"wb_f8": bytes} -> Float64Array (a copy: the message's bytes need not be 8-byte aligned).
function decode(value) {
  if (Array.isArray(value)) return value.map(decode);
  if (value && typeof value === "object" && !ArrayBuffer.isView(value) && !(value instanceof ArrayBuffer)) {
    if ("wb_f8" in value) return new Float64Array(bytesOf(value.wb_f8).slice().buffer);
    const out = {};
    for (const [key, item] of Object.entries(value)) out[key] = decode(item);
    return out;
  }
  return value;
}

function initialize({ model }) {
  const source = model.get("source");
  const slot = plotlySlot();
  if (source && !slot.loading) {
    slot.loading = true;
    loadPlotly(source).then(slot.resolve, (error) => {
      slot.loading = false;
      console.error("[verl-workbench] plotly.js did not load", error);
    });
  }
}

function render({ model, el }) {
  if (model.get("source")) return undefined;  // the plotly.js model shows nothing
  const div = document.createElement("div");
  div.className = "wb-chart-plot";
  div.textContent = "loading the chart…";
  el.appendChild(div);
  let drawn = -1;
  let alive = true;
  const draw = (Plotly) => {
    if (!alive) return;
    if (drawn < 0) div.textContent = "";
    const figure = decode(model.get("figure") || {});
    Plotly.react(div, figure.data || [], figure.layout || {}, { displaylogo: false, responsive: true });
    drawn = model.get("revision");
    div.dataset.revision = String(drawn);
  };
  const beat = () => model.send({ kind: "view", revision: drawn });
  let redraw = () => {};
  let plotly = null;
  plotlySlot().promise.then((Plotly) => {
    plotly = Plotly;
    redraw = () => draw(Plotly);
    redraw();
    model.on("change:figure", redraw);
    beat();
  });
  const resize = new ResizeObserver(() => {
    if (drawn >= 0 && alive) plotly.Plots.resize(div);
  });
  resize.observe(el);
  beat();
  const timer = setInterval(beat, HEARTBEAT_MS);
  return () => {
    alive = false;
    clearInterval(timer);
    resize.disconnect();
    model.off("change:figure", redraw);
    if (plotly) plotly.purge(div);
  };
}

export default { initialize, render };

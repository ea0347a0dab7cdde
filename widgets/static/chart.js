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
const CONFIG = { displaylogo: false, responsive: true };
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
  // A draw that fails (throws, or its promise rejects) is said in the console (the browser tests fail on it) and
  // drawn anew from scratch: CI once showed a step breakdown left blank as a replay ended, a moment after every
  // chart had been seen drawn (not reproduced since). The config goes with the first draw only: Plotly.react given
  // a config resets the plot's context (plotly.js issue 4856).
  const drawAnew = (Plotly, figure, error) => {
    console.error("[verl-workbench] a chart's draw failed; drawn anew", error);
    if (!alive) return;
    Plotly.purge(div);
    Promise.resolve(Plotly.newPlot(div, figure.data || [], figure.layout || {}, CONFIG))
      .catch((again) => console.error("[verl-workbench] a chart could not be drawn", again));
  };
  const draw = (Plotly) => {
    const revision = model.get("revision");
    if (!alive || revision === drawn) return;
    const figure = decode(model.get("figure") || {});
    const first = drawn < 0;
    if (first) div.textContent = "";
    try {
      const done = Plotly.react(div, figure.data || [], figure.layout || {}, ...(first ? [CONFIG] : []));
      if (done && typeof done.catch === "function") done.catch((error) => drawAnew(Plotly, figure, error));
    } catch (error) {
      drawAnew(Plotly, figure, error);
    }
    drawn = revision;
    div.dataset.revision = String(drawn);
  };
  const beat = () => {  // a page unloading or reloading has closed its kernel connection: the next view says so
    try {
      model.send({ kind: "view", revision: drawn });
    } catch (error) {
      if (!String(error && error.message).startsWith("Cannot send")) throw error;
    }
  };
  let redraw = () => {};
  let plotly = null;
  plotlySlot().promise.then((Plotly) => {
    plotly = Plotly;
    redraw = () => draw(Plotly);
    redraw();
    model.on("change:figure", redraw);
    beat();
  });
  const resize = new ResizeObserver(() => {  // a chart hidden meanwhile refuses the resize: nothing to draw then
    if (drawn >= 0 && alive) plotly.Plots.resize(div).catch(() => {});
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

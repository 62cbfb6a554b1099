/* moesim export-site: the page. It reads the index and each machine's rows from the .json.js files
   beside it (script elements, which work from file://, where browsers refuse to fetch files) and
   shows the numbers as they are in those files: it filters, sorts and draws, and computes none. */
(function () {
  "use strict";

  var state = {
    index: null, files: {}, rows: {}, machineId: null, modelId: null,
    sort: {key: "decode_tok_s", desc: true}
  };
  // Speed first: on a narrow screen the table scrolls sideways and the first columns stay in view.
  var COLUMNS = [
    {key: "model", label: "Model", text: true},
    {key: "quant", label: "Quant", text: true},
    {key: "runtime", label: "Runtime", text: true},
    {key: "decode_tok_s", label: "Decode tok/s", fmt: speed},
    {key: "aggregate_tok_s", label: "Batch tok/s", fmt: speed, batchOnly: true},
    {key: "prefill_tok_s", label: "Prefill tok/s", fmt: speed},
    {key: "max_context", label: "Max context", fmt: tokens},
    {key: "placement", label: "Placement", text: true},
    {key: "fits", label: "Fits in", text: true},
    {key: "weights_bytes", label: "Weights", fmt: gib},
    {key: "gpu_bytes", label: "On GPU", fmt: gib},
    {key: "host_bytes", label: "In RAM", fmt: gib},
    {key: "bottleneck", label: "Bottleneck", text: true, fmt: words}
  ];
  var PALETTE = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#17becf", "#8c564b", "#e377c2",
                 "#7f7f7f", "#bcbd22"];

  window.moesimSite = {receive: receive, state: state};

  function $(id) { return document.getElementById(id); }

  function el(tag, attrs, text) {
    var e = document.createElement(tag);
    Object.keys(attrs || {}).forEach(function (k) { e.setAttribute(k, attrs[k]); });
    if (text !== undefined && text !== null) { e.textContent = text; }
    return e;
  }

  // ------------------------------------------------------------------ formatting (display only)
  function gib(b) { return b ? (b / 1073741824).toFixed(1) + " GiB" : "\u2013"; }
  function speed(x) {
    if (x === null || x === undefined) { return "\u2013"; }
    return x >= 100 ? x.toFixed(0) : x >= 10 ? x.toFixed(1) : x.toFixed(2);
  }
  function tokens(n) {
    if (n >= 1048576 && n % 1048576 === 0) { return (n / 1048576) + "M"; }
    if (n >= 1024 && n % 1024 === 0) { return (n / 1024) + "K"; }
    return n.toLocaleString("en-US");
  }
  function words(id) { return String(id).replace(/_/g, " "); }
  function params(n) { return (n / 1e9).toFixed(n >= 1e11 ? 0 : 1) + "B"; }

  // ------------------------------------------------------------------ data
  function receive(payload) {
    if (payload.kind === "index") {
      state.index = payload;
      init();
    } else if (payload.kind === "machine") {
      var id = payload.machine.id;
      state.files[id] = payload;
      state.rows[id] = payload.rows.map(function (r) { return asObject(payload.fields, r); });
      if (id === state.machineId) { render(); }
    }
  }

  function asObject(fields, r) {
    var o = {};
    for (var i = 0; i < fields.length; i++) { o[fields[i]] = r[i]; }
    return o;
  }

  function machineById(id) {
    return state.index.machines.filter(function (m) { return m.id === id; })[0];
  }

  function loadMachine(id) {
    state.machineId = id;
    var m = machineById(id);
    $("machine-description").textContent = m.description + (m.storage ? "; storage " + m.storage : "");
    if (state.rows[id]) { render(); return; }
    setStatus("Loading " + m.file + " \u2026");
    var s = el("script", {src: m.script});
    s.onerror = function () { setStatus("Could not read " + m.script + " beside this page."); };
    document.body.appendChild(s);
  }

  // ------------------------------------------------------------------ machine picker
  function gpuKey(m) {
    if (!m.gpu) { return "none (CPU only)"; }
    return (m.gpus > 1 ? m.gpus + "\u00d7 " : "") + m.gpu + (m.unified ? " (unified memory)" : "");
  }
  function ramKey(m) { return String(m.ram_gb); }
  function chanKey(m) { return String(m.channels); }

  function distinct(list, key, numeric) {
    var seen = {}, out = [];
    list.forEach(function (m) { var k = key(m); if (!seen[k]) { seen[k] = true; out.push(k); } });
    if (numeric) { out.sort(function (a, b) { return Number(a) - Number(b); }); }
    return out;
  }

  function fillSelect(sel, values, labels, keep) {
    var prev = keep !== undefined ? keep : sel.value;
    sel.innerHTML = "";
    values.forEach(function (v, i) { sel.appendChild(el("option", {value: v}, labels ? labels[i] : v)); });
    if (values.indexOf(prev) >= 0) { sel.value = prev; }
    return sel.value;
  }

  // The selects narrow one another: GPU, then the RAM sizes there are with it, then the channel counts;
  // a fourth select appears when machines still share all three (they differ in PCIe, storage, ...).
  // *want*: a machine entry to select (from the address bar).
  function pickMachine(changed, want) {
    var all = state.index.machines;
    if (want) { $("pick-gpu").value = gpuKey(want); }
    var gpu = $("pick-gpu").value;
    var withGpu = all.filter(function (m) { return gpuKey(m) === gpu; });
    var rams = distinct(withGpu, ramKey, true);
    var ram = fillSelect($("pick-ram"), rams, rams.map(function (r) { return Number(r) + " GB"; }),
                         want ? ramKey(want) : undefined);
    var withRam = withGpu.filter(function (m) { return ramKey(m) === ram; });
    var chans = distinct(withRam, chanKey, true);
    var chan = fillSelect($("pick-channels"), chans, chans.map(function (c) { return c === "0" ? "\u2013" : c; }),
                          want ? chanKey(want) : undefined);
    var ids = withRam.filter(function (m) { return chanKey(m) === chan; }).map(function (m) { return m.id; });
    var keep = want ? want.id : changed === "machine" ? undefined : state.machineId;
    var id = fillSelect($("pick-machine"), ids, null, keep);
    $("pick-machine-label").hidden = ids.length < 2;
    if (id && id !== state.machineId) { loadMachine(id); }
  }

  // ------------------------------------------------------------------ the table
  function setStatus(text) { $("status").textContent = text; }

  // The "Fits in" choice: fits names the tiers a configuration occupies ("gpu+host", "host+storage",
  // "unified", ...) or is "no".
  function fitsPass(r) {
    var mode = $("filter-fits").value;
    if (mode === "all") { return true; }
    if (r.fits === "no") { return false; }
    if (mode === "ram") { return r.fits.indexOf("storage") < 0; }
    return true;
  }

  function visibleRows() {
    var rows = state.rows[state.machineId] || [];
    var ctx = Number($("pick-context").value), batch = Number($("pick-batch").value);
    var text = $("filter-text").value.trim().toLowerCase();
    var minTok = parseFloat($("filter-min-tok").value);
    return rows.filter(function (r) {
      if (r.context !== ctx || r.batch !== batch || !fitsPass(r)) { return false; }
      if (!isNaN(minTok) && !(r.decode_tok_s >= minTok)) { return false; }
      if (!text) { return true; }
      var hay = [r.model, r.quant, r.runtime, r.placement, r.kv_dtype, r.fits].join(" ").toLowerCase();
      return text.split(/\s+/).every(function (w) { return hay.indexOf(w) >= 0; });
    });
  }

  function compare(a, b, key) {
    var x = a[key], y = b[key];
    if (x === y) { return 0; }
    if (x === null || x === undefined) { return 1; }
    if (y === null || y === undefined) { return -1; }
    return typeof x === "number" ? x - y : String(x).localeCompare(String(y));
  }

  function sortRows(rows) {
    var key = state.sort.key, sign = state.sort.desc ? -1 : 1;
    return rows.slice().sort(function (a, b) {
      return sign * compare(a, b, key) || compare(a, b, "model") || compare(a, b, "quant");
    });
  }

  // Batch tok/s only at batch > 1 (it equals decode tok/s at batch 1), the runtime only when the
  // export has more than one, GPU bytes only on a machine with a GPU.
  function columns() {
    var batch = Number($("pick-batch").value), runtimes = state.index.runtimes.length;
    var gpus = state.machineId ? machineById(state.machineId).gpus : 1;
    return COLUMNS.filter(function (c) {
      return (!c.batchOnly || batch > 1) && (c.key !== "runtime" || runtimes > 1) && (c.key !== "gpu_bytes" || gpus > 0);
    });
  }

  function renderHead() {
    var tr = document.querySelector("#results thead tr");
    tr.innerHTML = "";
    columns().forEach(function (c) {
      var th = el("th", {"data-key": c.key, scope: "col", tabindex: "0",
                         "class": (c.text ? "text" : "num") + (state.sort.key === c.key ? " sorted" : "")});
      th.textContent = c.label + (state.sort.key === c.key ? (state.sort.desc ? " \u25bc" : " \u25b2") : "");
      th.setAttribute("aria-sort", state.sort.key === c.key ? (state.sort.desc ? "descending" : "ascending")
                                                             : "none");
      tr.appendChild(th);
    });
  }

  function renderRow(r) {
    var tr = el("tr", {"data-model": r.model, "data-quant": r.quant, "data-runtime": r.runtime,
                       "data-placement-rule": r.placement_rule, "data-kv": r.kv_dtype, "data-policy": r.policy});
    if (r.model === state.modelId) { tr.className = "open"; }
    columns().forEach(function (c) {
      var v = r[c.key];
      var td = el("td", {"data-field": c.key, "data-value": v === null ? "" : String(v),
                         "class": c.text ? "text" : "num"});
      if (c.key === "model") {
        var b = el("button", {type: "button", "class": "link"}, v);
        b.addEventListener("click", function () { openModel(r.model); });
        td.appendChild(b);
      } else {
        td.textContent = c.fmt ? c.fmt(v) : v;
        if (c.key === "fits") { td.title = "memory tiers the configuration occupies"; }
        addInterval(td, r, c.key);
      }
      tr.appendChild(td);
    });
    return tr;
  }

  // The 80 % prediction interval the row carries (decode_tok_s_lo / _hi ...), under the number; the
  // cell's data-value stays the point estimate.
  function addInterval(td, r, key) {
    var lo = r[key + "_lo"], hi = r[key + "_hi"];
    if (lo === null || lo === undefined || hi === null || hi === undefined) { return; }
    var span = el("span", {"class": "interval", "data-lo": String(lo), "data-hi": String(hi)},
                  speed(lo) + "\u2013" + speed(hi));
    td.appendChild(el("br"));
    td.appendChild(span);
    td.title = "80 % prediction interval " + speed(lo) + "\u2013" + speed(hi) +
               " (out-of-sample residuals of this device, placement and runtime regime)";
  }

  function render() {
    if (!state.index || !state.rows[state.machineId]) { return; }
    writeHash();
    renderHead();
    var rows = sortRows(visibleRows());
    var body = document.querySelector("#results tbody");
    body.innerHTML = "";
    rows.forEach(function (r) { body.appendChild(renderRow(r)); });
    var ctx = tokens(Number($("pick-context").value)), batch = $("pick-batch").value;
    var total = state.rows[state.machineId].length;
    if (!total) {
      setStatus("Nothing in this export fits " + state.machineId + ".");
    } else if (!rows.length) {
      setStatus("No configuration shown at context " + ctx + ", batch " + batch +
                ": try a shorter context or loosen the filters.");
    } else {
      setStatus(rows.length + " configuration" + (rows.length > 1 ? "s" : "") + " at context " + ctx +
                ", batch " + batch + " on " + state.machineId + ".");
    }
    if (state.modelId) { renderDetail(); }
  }

  // ------------------------------------------------------------------ one model: chart and flags
  function seriesKey(r) { return [r.quant, r.runtime, r.kv_dtype, r.placement_rule, r.policy].join("|"); }

  function modelSeries(modelId) {
    var batch = Number($("pick-batch").value);
    var groups = {}, order = [];
    (state.rows[state.machineId] || []).forEach(function (r) {
      if (r.model !== modelId || r.batch !== batch || !fitsPass(r)) { return; }
      var k = seriesKey(r);
      if (!groups[k]) { groups[k] = []; order.push(k); }
      groups[k].push(r);
    });
    var varying = {};
    ["runtime", "kv_dtype", "placement_rule", "policy"].forEach(function (f) {
      var seen = {};
      order.forEach(function (k) { seen[groups[k][0][f]] = true; });
      varying[f] = Object.keys(seen).length > 1;
    });
    return order.map(function (k, i) {
      var pts = groups[k].slice().sort(function (a, b) { return a.context - b.context; });
      var r0 = pts[0], label = r0.quant;
      ["runtime", "kv_dtype", "placement_rule", "policy"].forEach(function (f) {
        if (varying[f]) { label += " " + r0[f]; }
      });
      return {key: k, label: label, points: pts, color: PALETTE[i % PALETTE.length]};
    });
  }

  function openModel(id) {
    state.modelId = id;
    $("detail").hidden = false;
    render();
    $("detail").scrollIntoView({block: "nearest"});
  }

  function renderDetail() {
    var m = state.index.models.filter(function (x) { return x.id === state.modelId; })[0];
    if (!m) { return; }
    $("detail-title").textContent = m.name + " on " + state.machineId;
    $("detail-meta").textContent = m.family + ", " + params(m.total_params) + " parameters, " +
      params(m.active_params) + " active per token" + (m.experts ? ", " + m.experts + " experts top-" + m.top_k : "") +
      "; trained context " + tokens(m.max_context) + ". Decode tokens/s per sequence at batch " +
      $("pick-batch").value + " against context.";
    var series = modelSeries(m.id);
    var chart = $("chart");
    chart.innerHTML = "";
    chart.appendChild(series.length ? drawChart(series) : el("p", {}, "Nothing of this model fits this machine."));
    renderFlags(series);
  }

  function renderFlags(series) {
    var ctx = Number($("pick-context").value);
    $("detail-context").textContent = "context " + tokens(ctx) + " (or the largest that fits)";
    var body = document.querySelector("#flags tbody");
    body.innerHTML = "";
    series.forEach(function (s) {
      var at = s.points.filter(function (r) { return r.context <= ctx; });
      var r = at.length ? at[at.length - 1] : s.points[0];
      var tr = el("tr", {"data-series": s.key});
      var sw = el("td", {"class": "text"});
      sw.appendChild(el("span", {"class": "swatch", style: "background:" + s.color}));
      sw.appendChild(document.createTextNode(s.label));
      tr.appendChild(sw);
      tr.appendChild(el("td", {"class": "text"}, r.runtime));
      tr.appendChild(el("td", {"class": "text"}, r.placement));
      tr.appendChild(el("td", {"class": "num", "data-value": String(r.context)}, tokens(r.context)));
      var f = el("td", {"class": "text flags", "data-field": "flags"});
      f.appendChild(el("code", {}, r.flags || "(no flags: " + r.runtime + " decides)"));
      tr.appendChild(f);
      body.appendChild(tr);
    });
  }

  // ------------------------------------------------------------------ the SVG chart
  var SVGNS = "http://www.w3.org/2000/svg";

  function svg(tag, attrs, text) {
    var e = document.createElementNS(SVGNS, tag);
    Object.keys(attrs || {}).forEach(function (k) { e.setAttribute(k, attrs[k]); });
    if (text !== undefined) { e.textContent = text; }
    return e;
  }

  function niceStep(max) {
    var raw = max / 5, mag = Math.pow(10, Math.floor(Math.log10(raw)));
    var n = raw / mag;
    return (n > 5 ? 10 : n > 2 ? 5 : n > 1 ? 2 : 1) * mag;
  }

  function chartScales(series, W, H, pad) {
    var xs = [], ymax = 0;
    series.forEach(function (s) {
      s.points.forEach(function (p) {
        xs.push(p.context);
        if (p.decode_tok_s > ymax) { ymax = p.decode_tok_s; }
      });
    });
    var lo = Math.log2(Math.min.apply(null, xs)), hi = Math.log2(Math.max.apply(null, xs));
    if (hi - lo < 1) { lo -= 0.5; hi += 0.5; }
    var step = niceStep(ymax || 1), top = Math.ceil((ymax || 1) / step) * step;
    return {
      lo: lo, hi: hi, top: top, step: step,
      x: function (c) { return pad.l + (Math.log2(c) - lo) / (hi - lo) * (W - pad.l - pad.r); },
      y: function (v) { return H - pad.b - v / top * (H - pad.t - pad.b); }
    };
  }

  function drawAxes(g, sc, W, H, pad) {
    for (var v = 0; v <= sc.top + 1e-9; v += sc.step) {
      var y = sc.y(v);
      g.appendChild(svg("line", {x1: pad.l, x2: W - pad.r, y1: y, y2: y, "class": "grid"}));
      g.appendChild(svg("text", {x: pad.l - 8, y: y + 4, "text-anchor": "end", "class": "tick"},
                        String(Number(v.toPrecision(6)))));
    }
    for (var e = Math.ceil(sc.lo); e <= Math.floor(sc.hi); e++) {
      var x = sc.x(Math.pow(2, e));
      g.appendChild(svg("line", {x1: x, x2: x, y1: pad.t, y2: H - pad.b, "class": "grid"}));
      g.appendChild(svg("text", {x: x, y: H - pad.b + 18, "text-anchor": "middle", "class": "tick"},
                        tokens(Math.pow(2, e))));
    }
    g.appendChild(svg("text", {x: (W + pad.l - pad.r) / 2, y: H - 6, "text-anchor": "middle", "class": "label"},
                      "context (tokens, log scale)"));
    g.appendChild(svg("text", {x: 16, y: (H - pad.b + pad.t) / 2, "text-anchor": "middle", "class": "label",
                               transform: "rotate(-90 16 " + (H - pad.b + pad.t) / 2 + ")"}, "decode tok/s"));
  }

  function drawChart(series) {
    var W = 760, H = 340, pad = {l: 64, r: 20, t: 16, b: 48};
    var sc = chartScales(series, W, H, pad);
    var root = svg("svg", {viewBox: "0 0 " + W + " " + H, role: "img", "class": "chart",
                           "aria-label": "decode tokens per second against context"});
    drawAxes(root, sc, W, H, pad);
    series.forEach(function (s) {
      var d = s.points.map(function (p, i) {
        return (i ? "L" : "M") + sc.x(p.context).toFixed(1) + " " + sc.y(p.decode_tok_s).toFixed(1);
      }).join(" ");
      root.appendChild(svg("path", {d: d, stroke: s.color, "class": "series", "data-series": s.key}));
      s.points.forEach(function (p) {
        var c = svg("circle", {cx: sc.x(p.context), cy: sc.y(p.decode_tok_s), r: 3.5, fill: s.color});
        c.appendChild(svg("title", {}, s.label + ": " + speed(p.decode_tok_s) + " tok/s at " + tokens(p.context) +
                                       " (" + p.placement + ")"));
        root.appendChild(c);
      });
    });
    var wrap = el("figure", {"class": "chart-wrap"});
    wrap.appendChild(root);
    var legend = el("figcaption", {"class": "legend"});
    series.forEach(function (s) {
      var item = el("span", {"class": "legend-item"});
      item.appendChild(el("span", {"class": "swatch", style: "background:" + s.color}));
      item.appendChild(document.createTextNode(s.label));
      legend.appendChild(item);
    });
    wrap.appendChild(legend);
    return wrap;
  }

  // ------------------------------------------------------------------ start, and the address bar
  function readHash() {
    var out = {};
    location.hash.replace(/^#/, "").split("&").forEach(function (kv) {
      var i = kv.indexOf("=");
      if (i > 0) { out[decodeURIComponent(kv.slice(0, i))] = decodeURIComponent(kv.slice(i + 1)); }
    });
    return out;
  }

  function writeHash() {
    var h = {machine: state.machineId, context: $("pick-context").value, batch: $("pick-batch").value};
    if (state.modelId) { h.model = state.modelId; }
    var text = "#" + Object.keys(h).map(function (k) {
      return encodeURIComponent(k) + "=" + encodeURIComponent(h[k]);
    }).join("&");
    if (location.hash !== text) { history.replaceState(null, "", text); }
  }

  function defaultContext(contexts) {
    var c = contexts.filter(function (x) { return x >= 4096; });
    return String(c.length ? c[0] : contexts[contexts.length - 1]);
  }

  // A second click on the sorted column reverses it; a new column starts with text A-Z, numbers high-low.
  function sortBy(th) {
    if (!th) { return; }
    var key = th.getAttribute("data-key"), text = COLUMNS.filter(function (c) { return c.key === key; })[0].text;
    state.sort = {key: key, desc: state.sort.key === key ? !state.sort.desc : !text};
    render();
    var again = document.querySelector("#results th[data-key='" + key + "']");
    if (again) { again.focus(); }
  }

  function initControls(ix, hash) {
    var ctxs = ix.contexts.map(String), batches = ix.batches.map(String);
    fillSelect($("pick-context"), ctxs, ix.contexts.map(tokens),
               ctxs.indexOf(hash.context) >= 0 ? hash.context : defaultContext(ix.contexts));
    fillSelect($("pick-batch"), batches, null, batches.indexOf(hash.batch) >= 0 ? hash.batch : batches[0]);
    ["pick-context", "pick-batch", "filter-fits"].forEach(function (id) { $(id).addEventListener("change", render); });
    ["filter-text", "filter-min-tok"].forEach(function (id) { $(id).addEventListener("input", render); });
    $("pick-gpu").addEventListener("change", function () { pickMachine(); });
    $("pick-ram").addEventListener("change", function () { pickMachine(); });
    $("pick-channels").addEventListener("change", function () { pickMachine(); });
    $("pick-machine").addEventListener("change", function () { pickMachine("machine"); });
    $("detail-close").addEventListener("click", function () {
      state.modelId = null; $("detail").hidden = true; render();
    });
    var head = document.querySelector("#results thead");
    head.addEventListener("click", function (ev) { sortBy(ev.target.closest("th")); });
    head.addEventListener("keydown", function (ev) {
      if (ev.key === "Enter" || ev.key === " ") { ev.preventDefault(); sortBy(ev.target.closest("th")); }
    });
  }

  function init() {
    var ix = state.index, hash = readHash();
    document.title = ix.title;
    $("title").textContent = ix.title;
    $("description").textContent = ix.description;
    $("versions").textContent = "moesim " + ix.moesim_version + ", catalog " + ix.catalog_version +
      ", site schema " + ix.schema_version + ", " + ix.sweep.mode + " sweep " + ix.sweep.spec_hash.slice(0, 12) +
      ". Data: index.json, machines/*.json, models/*.json (schemas in schema/).";
    initControls(ix, hash);
    if (!ix.machines.length) { setStatus("This export has no machines."); return; }
    var gpus = distinct(ix.machines, gpuKey, false);
    fillSelect($("pick-gpu"), gpus, null, gpus[0]);
    if (hash.model && ix.models.some(function (m) { return m.id === hash.model; })) {
      state.modelId = hash.model;
      $("detail").hidden = false;
    }
    pickMachine(null, machineById(hash.machine) || ix.machines[0]);
  }
})();

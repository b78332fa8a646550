// The page of one crash snapshot: the fault, the triage checklist, plots of the last steps and
// of the GPUs with the fault marked, the tracebacks, the requests at the last step, the events,
// the log. Everything from /api/v1; every string reaches the DOM as text.
'use strict';

(async function main() {
  const { api, download, el, showError, isoTime, fmt, plot, legend, linkPlots } = FR;
  const id = document.body.dataset.snapshotId;
  const status = document.getElementById('status');
  let doc, checklist;
  try {
    [doc, checklist] = await Promise.all([api('/api/v1/snapshots/' + id), api('/api/v1/snapshots/' + id + '/checklist')]);
  } catch (err) {
    showError(status, err);
    return;
  }
  document.title = 'Flight recorder: snapshot ' + id + ' of ' + doc.engine;
  document.getElementById('title').textContent = 'Snapshot ' + id + ': ' + doc.engine + ' on ' + doc.host;
  status.replaceChildren(
    'fault at ' + isoTime(doc.fault_ts) + ' · ',
    doc.incident_id ? el('a', { href: '/incidents/' + doc.incident_id, id: 'incident-link' }, 'incident ' + doc.incident_id) : 'no incident', ' · ',
    el('a', { href: '#', id: 'export', onclick: (ev) => { ev.preventDefault(); download('/api/v1/snapshots/' + id + '/export', 'flightrec-snapshot-' + id + '.json.gz').catch((e) => showError(status, e)); } }, 'download export (.json.gz)'),
    ' · ', el('a', { href: '/snapshots?incident_id=' + encodeURIComponent(doc.incident_id ?? '') }, 'snapshots of this incident'));
  document.getElementById('main').hidden = false;
  if (doc.stacks) {  // a wedge's snapshot: its processes' stacks (stacks.js)
    const card = document.getElementById('stacks-card');
    card.hidden = false;
    FRStacks.render(card, doc.stacks, doc.fault_ts);
  }

  const steps = doc.steps || [];
  const cols = (doc.requests && doc.requests.columns) || {};
  const s = doc.summary || {};
  const failed = s.failed_processes || {};

  // The fault on the step axis: the step the failing workers were in, else the last step
  // recorded before the fault.
  let faultStep = null;
  for (const f of Object.values(failed)) if (f.step !== null && f.step !== undefined) faultStep = Math.max(faultStep ?? -Infinity, f.step);
  if (faultStep === null) for (const r of steps) if (r.ts <= doc.fault_ts) faultStep = r.step;
  const faultLabel = 'fault' + (faultStep !== null ? ' @ step ' + faultStep : '');

  // -- the fault ------------------------------------------------------------------------------
  const trig = doc.trigger || {};
  const fault = document.getElementById('fault');
  const serverSummary = !!document.getElementById('summary');  // rendered on the server for this reader
  fault.hidden = false;
  fault.append(
    serverSummary ? el('h2', {}, 'Fault details') : el('h2', {}, el('span', { class: 'fault-kind' }, trig.kind || '?'), ' ', trig.message || ''),
    el('div', { class: 'facts' },
      el('span', {}, 'source: ' + (trig.source || '')),
      trig.xid !== null && trig.xid !== undefined ? el('span', {}, 'Xid ' + trig.xid) : null,
      el('span', {}, 'steps recorded: ' + steps.length + (steps.length ? ' (' + steps[0].step + '–' + steps[steps.length - 1].step + ')' : '')),
      el('span', {}, 'request rows: ' + ((cols.step || []).length)),
      s.amended_at ? el('span', {}, 'amended with late evidence at ' + isoTime(s.amended_at)) : null));
  const fl = Object.entries(failed);
  if (fl.length) {
    const t = el('table', { class: 'kv' });
    for (const [proc, f] of fl) t.appendChild(el('tr', {}, el('th', {}, proc), el('td', {}, 'step ' + fmt(f.step)), el('td', {}, f.kind || ''), el('td', {}, f.message || '')));
    fault.appendChild(t);
  }

  // -- checklist ------------------------------------------------------------------------------
  // ● means the snapshot holds the answer, not that the answer is healthy; judging it is the
  // reader's job (the values are shown as they were recorded).
  const clSection = document.getElementById('checklist').parentElement;
  if (!steps.length || !Object.keys(doc.fingerprint || {}).length) {
    const why = trig.kind === 'manual'
      ? 'This manual snapshot of ' + doc.engine + ' holds no engine steps: no in-engine recorder wrote for this engine. '
      : 'No in-engine recorder data for ' + doc.engine + ': ';
    clSection.insertBefore(el('p', { class: 'note', id: 'no-recorder' }, why +
      'The items marked ○ come from the recorder (its fingerprint and its steps). Check that this package is installed in vLLM\'s environment, ' +
      'that vLLM runs with --scheduler-cls collector.vllm.RecordingScheduler, that FLIGHTREC_RECORDER_DIR is the same for vLLM and the sidecar, ' +
      'and that the sidecar can join the recorder to this engine: it does so by the configured URL\'s port on this host; ' +
      'where it cannot see the engine\'s processes (another container, a Service URL) set FLIGHTREC_ENGINE_NAME=' + doc.engine + ' for vLLM.'), document.getElementById('checklist'));
  }
  clSection.insertBefore(el('p', { class: 'muted legend-line' }, '● recorded (the snapshot holds the value; not a verdict on it) · ○ not recorded · – not exposed by this vLLM'), document.getElementById('checklist'));
  const tbody = document.querySelector('#checklist tbody');
  const MARK = { recorded: ['●', 'recorded', 'recorded'], not_recorded: ['○', 'missing', 'not recorded'], not_exposed: ['–', 'not-exposed', 'not exposed by this vLLM'] };
  for (const item of checklist.items) {
    const status = item.status || (item.recorded ? 'recorded' : 'not_recorded');
    const [mark, cls, title] = MARK[status] || MARK.not_recorded;
    const value = el('td', { class: status === 'recorded' ? '' : cls, 'data-key': item.key }, item.text);
    if (item.key === 'mirror_rows' && item.recorded) {
      value.replaceChildren(mirrorSummary(item.value), ' · ', el('a', { href: '#requests-card' }, 'every request: the table below'));
      if (item.detail) value.appendChild(el('div', { class: 'muted' }, 'most: ' + Object.entries(item.detail).map(([k, v]) => k + ' (' + v + ')').join(', ')));
    } else if (item.detail !== undefined && item.detail !== null) value.appendChild(detailOf(item.detail));
    tbody.appendChild(el('tr', { 'data-status': status }, el('td', { class: 'check ' + cls, title }, mark), el('th', {}, item.label), value));
  }
  function mirrorSummary(v) {
    return v.total + ' rows over ' + v.requests + ' requests (per request min ' + v.min + ', p50 ' + v.p50 + ', p90 ' + v.p90 + ', max ' + v.max + ')';
  }
  // a detail is data: a small key/value list, never JSON text
  function detailOf(d) {
    if (d === null || typeof d !== 'object') return el('div', { class: 'muted' }, fmt(d));
    const list = el('dl', { class: 'detail' });
    for (const [k, v] of Array.isArray(d) ? d.entries() : Object.entries(d)) {
      list.append(el('dt', {}, String(k)), el('dd', {}, v !== null && typeof v === 'object' ? fmt(v) : fmt(v)));
    }
    return list;
  }

  // -- plots: one time axis ------------------------------------------------------------------
  // Every plot, step or GPU, is drawn over seconds from the fault (the steps by their own
  // timestamps), on one shared range, with one crosshair: hovering any plot shows the values of
  // all of them at that moment.
  const rel = (ts) => ts - doc.fault_ts;
  const stepTs = new Map(steps.map((r) => [r.step, r.ts]));
  const linked = [];
  const gpus = new Map();
  for (const g of doc.gpu_samples || []) {
    const key = 'GPU ' + (g.index ?? '?') + (g.name ? ' ' + g.name : '');
    if (!gpus.has(key)) gpus.set(key, []);
    gpus.get(key).push(g);
  }
  const stepSpan = steps.length ? [rel(steps[0].ts), rel(steps[steps.length - 1].ts)] : null;
  const gpuTs = (doc.gpu_samples || []).map((g) => rel(g.ts));
  const gpuSpan = gpuTs.length ? [Math.min(...gpuTs), Math.max(...gpuTs)] : null;
  const around = (span) => {
    const lo = Math.min(span[0], 0), hi = Math.max(span[1], 0);
    const padS = Math.max((hi - lo) * 0.03, 0.05);
    return [lo - padS, hi + padS];
  };
  const ranges = { steps: stepSpan ? around(stepSpan) : null, all: around([Math.min(stepSpan ? stepSpan[0] : 0, gpuSpan ? gpuSpan[0] : 0), Math.max(stepSpan ? stepSpan[1] : 0, gpuSpan ? gpuSpan[1] : 0)]) };
  let rangeName = ranges.steps ? 'steps' : 'all';
  const drawn = [];
  function addPlot(containerId, title, series, opts, legendOpts) {
    const canvas = el('canvas', { 'data-plot': title });
    const readout = el('div', { class: 'readout muted', 'data-readout': title });
    const box = el('div', { class: 'plot' }, el('h3', {}, title), canvas, readout);
    if (legendOpts) box.appendChild(legend(legendOpts.series, legendOpts.limit, legendOpts.title));
    else if (series.length > 1) box.appendChild(legend(series));
    document.getElementById(containerId).appendChild(box);
    drawn.push({ canvas, series, opts });
    linked.push({ canvas, readout });
  }
  function drawAll() {
    for (const d of drawn) plot(d.canvas, d.series, { ...d.opts, xRange: ranges[rangeName] });
    document.body.dataset.range = rangeName;
  }
  const xs = steps.map((r) => rel(r.ts));
  const col = (name) => steps.map((r) => (r[name] === undefined ? null : r[name]));
  const common = { marker: 0, markerLabel: faultLabel, xLabel: 'seconds from the fault', xFmt: (x) => (x >= 0 ? '+' : '') + x.toFixed(3) + ' s' };
  document.getElementById('steps-note').textContent = steps.length ? steps.length + ' steps, ' + isoTime(steps[0].ts) + ' → ' + isoTime(steps[steps.length - 1].ts) + '; every plot on one time axis (seconds from the fault)' : 'no steps recorded';
  addPlot('step-plots', 'Running and waiting requests', [{ name: 'running', xs, ys: col('running') }, { name: 'waiting', xs, ys: col('waiting') }], { ...common, yMin: 0 });
  addPlot('step-plots', 'kv_cache_usage', [{ name: 'kv_cache_usage', xs, ys: col('kv_cache_usage') }], { ...common, yMin: 0 });
  addPlot('step-plots', 'Preemptions per step', [{ name: 'preemptions', xs, ys: col('preemptions') }], { ...common, yMin: 0 });
  addPlot('step-plots', 'Host-mirror rows (all requests)', [{ name: 'mirror rows', xs, ys: col('mirror_rows') }], { ...common, yMin: 0 });

  // Was it stalling, was it slowing? The time each step took (from one step's stamp to the
  // next's), the tokens it scheduled, and how they split between prefill and decode.
  const durMs = steps.map((r, i) => (i && r.ts !== undefined && steps[i - 1].ts !== undefined ? (r.ts - steps[i - 1].ts) * 1000 : null));
  addPlot('step-plots', 'Step duration (ms)', [{ name: 'step duration', xs, ys: durMs }], { ...common, yMin: 0, yFmt: (v) => fmt(v) + ' ms' });
  const tok = (r) => (r.prompt_tokens === null || r.prompt_tokens === undefined) && (r.generation_tokens === null || r.generation_tokens === undefined)
    ? null : (r.prompt_tokens || 0) + (r.generation_tokens || 0);
  addPlot('step-plots', 'Tokens per step', [{ name: 'tokens', xs, ys: steps.map(tok) }], { ...common, yMin: 0 });
  addPlot('step-plots', 'Scheduled prefill vs decode tokens', [
    { name: 'prefill (prompt_tokens)', xs, ys: col('prompt_tokens'), color: '#ff7f0e' },
    { name: 'decode (generation_tokens)', xs, ys: col('generation_tokens'), color: '#1f77b4' }], { ...common, yMin: 0 });

  // -- per request: what a person reads at 256 running -----------------------------------------
  // Percentile bands over the requests of each step (min-max, p10-p90 shaded, p50 a line), the
  // few longest requests at the fault named in colour, and any one request drawn on demand
  // (the list beside the plot, or a row of the table below).
  const rs = cols.step || [], rid = cols.request_id || [], ctx = cols.computed_tokens || [], mir = cols.mirror_rows || [];
  let faultRowsStep = null;
  for (let i = 0; i < rs.length; i++) {
    const t = stepTs.get(rs[i]);
    if (t !== undefined && t <= doc.fault_ts && (faultRowsStep === null || rs[i] > faultRowsStep)) faultRowsStep = rs[i];
  }
  if (faultRowsStep === null && rs.length) faultRowsStep = rs[rs.length - 1];
  const byReq = new Map();
  const atFault = new Map();  // request id -> its context at the fault's step
  for (let i = 0; i < rs.length; i++) {
    let r = byReq.get(rid[i]);
    if (!r) { r = { xs: [], ctx: [], mir: [] }; byReq.set(rid[i], r); }
    const t = stepTs.get(rs[i]);
    r.xs.push(t === undefined ? NaN : rel(t)); r.ctx.push(ctx[i]); r.mir.push(mir[i] ?? null);
    if (rs[i] === faultRowsStep) atFault.set(rid[i], ctx[i]);
  }
  function bands(values, name, color) {
    // one point per step: the distribution of `values` over the rows of that step
    const per = new Map();
    for (let i = 0; i < rs.length; i++) {
      const v = values[i];
      if (v === null || v === undefined || !isFinite(v)) continue;
      let a = per.get(rs[i]); if (!a) { a = []; per.set(rs[i], a); } a.push(v);
    }
    const bx = [], mn = [], p10 = [], p50 = [], p90 = [], mx = [];
    for (const [st, a] of [...per].sort((p, q) => p[0] - q[0])) {
      const t = stepTs.get(st); if (t === undefined) continue;
      a.sort((p, q) => p - q);
      const q = (f) => a[Math.min(a.length - 1, Math.floor(f * a.length))];
      bx.push(rel(t)); mn.push(a[0]); p10.push(q(0.1)); p50.push(q(0.5)); p90.push(q(0.9)); mx.push(a[a.length - 1]);
    }
    return [
      { name: 'min–max', xs: bx, lo: mn, hi: mx, fill: 'rgba(31,119,180,0.12)' },
      { name: 'p10–p90', xs: bx, lo: p10, hi: p90, fill: 'rgba(31,119,180,0.28)' },
      { name: 'min', xs: bx, ys: mn, color: 'rgba(31,119,180,0.45)', width: 0.8 },
      { name: 'p50', xs: bx, ys: p50, color: color || '#1f5f99', width: 1.8 },
      { name: 'p90', xs: bx, ys: p90, color: 'rgba(31,119,180,0.7)', width: 1 },
      { name: 'max', xs: bx, ys: mx, color: 'rgba(31,119,180,0.45)', width: 0.8 },
    ];
  }
  const LONGEST = 5;
  const longest = [...atFault].sort((a, b) => (b[1] ?? -1) - (a[1] ?? -1)).slice(0, LONGEST).map(([id]) => id);
  const LONG_COLORS = ['#d62728', '#ff7f0e', '#2ca02c', '#9467bd', '#8c564b'];
  const ctxBands = bands(ctx);
  const named = longest.map((id, k) => ({ name: id, xs: byReq.get(id).xs, ys: byReq.get(id).ctx, color: LONG_COLORS[k], width: 1.4 }));
  const ctxTitle = 'Context length per request (computed tokens)';
  const summaryLine = atFault.size
    ? atFault.size + ' requests running at the fault (step ' + faultRowsStep + '); the ' + Math.min(LONGEST, atFault.size) + ' longest: '
    : 'no request rows at the fault';
  addPlot('step-plots', ctxTitle, [...ctxBands, ...named], common,
    { series: [...ctxBands.filter((x) => x.lo || x.name === 'p50'), ...named.map((x) => ({ ...x, name: x.name + ' (' + fmt(atFault.get(x.name)) + ')' }))], limit: 12, title: summaryLine });
  const ctxPlot = drawn[drawn.length - 1];
  const ctxBox = ctxPlot.canvas.parentElement;
  ctxBox.classList.add('wide');
  // the per-request view: any request, drawn over the bands in black
  const pick = el('select', { id: 'req-pick', 'aria-label': 'show one request' }, el('option', { value: '' }, 'show one request…'));
  for (const [id, c] of [...atFault].sort((a, b) => (b[1] ?? -1) - (a[1] ?? -1))) pick.appendChild(el('option', { value: id }, id + ' · ' + fmt(c) + ' tokens'));
  for (const id of byReq.keys()) if (!atFault.has(id)) pick.appendChild(el('option', { value: id }, id + ' · ended before the fault'));
  const pickNote = el('span', { class: 'muted', id: 'req-pick-note' });
  ctxBox.insertBefore(el('div', { class: 'pick' }, pick, ' ', pickNote), ctxPlot.canvas);
  function showRequest(id) {
    const base = [...ctxBands, ...named];
    const mbase = mirPlot ? mirBands : null;
    if (id && byReq.has(id)) {
      const r = byReq.get(id);
      ctxPlot.series = [...base, { name: id, xs: r.xs, ys: r.ctx, color: '#000', width: 2.2 }];
      if (mirPlot) mirPlot.series = [...mbase, { name: id, xs: r.xs, ys: r.mir, color: '#000', width: 2.2 }];
      const last = r.ctx[r.ctx.length - 1];
      pickNote.textContent = r.xs.length + ' steps recorded, context ' + fmt(r.ctx[0]) + ' → ' + fmt(last) + ' tokens';
      document.body.dataset.request = id;
    } else {
      ctxPlot.series = base;
      if (mirPlot) mirPlot.series = mbase;
      pickNote.textContent = '';
      delete document.body.dataset.request;
    }
    pick.value = id || '';
    drawAll();
  }
  pick.addEventListener('change', () => showRequest(pick.value));
  FR.showRequest = showRequest;

  let mirPlot = null, mirBands = null;
  if (mir.some((v) => v !== null && v !== undefined)) {
    mirBands = bands(mir);
    addPlot('step-plots', 'Host-mirror rows per request', mirBands, { ...common, yMin: 0 },
      { series: mirBands.filter((x) => x.lo || x.name === 'p50'), limit: 4, title: 'distribution over the requests of each step: ' });
    mirPlot = drawn[drawn.length - 1];
  }

  document.getElementById('gpu-note').textContent = gpus.size ? (doc.gpu_samples.length + ' samples of ' + gpus.size + ' GPU(s), on the same time axis') : 'no GPU samples recorded';
  const gpuSeries = (field, scale) => [...gpus].map(([name, samples]) => ({
    name, xs: samples.map((g) => rel(g.ts)), ys: samples.map((g) => (g[field] === null || g[field] === undefined ? null : g[field] * (scale || 1))),
  }));
  addPlot('gpu-plots', 'GPU utilisation (%)', gpuSeries('utilization'), { ...common, yMin: 0 });
  addPlot('gpu-plots', 'GPU memory used (GiB)', gpuSeries('memory_used', 1 / 2 ** 30), { ...common, yMin: 0 });
  addPlot('gpu-plots', 'GPU temperature (°C)', gpuSeries('temperature'), common);
  addPlot('gpu-plots', 'GPU power (W)', gpuSeries('power_w'), { ...common, yMin: 0 });
  const rangeBox = document.getElementById('range');
  if (ranges.steps && gpuSpan) {
    const button = el('button', { type: 'button', id: 'range-toggle' }, 'show the GPU samples\' whole range');
    button.addEventListener('click', () => {
      rangeName = rangeName === 'steps' ? 'all' : 'steps';
      button.textContent = rangeName === 'steps' ? 'show the GPU samples\' whole range' : 'show the recorded steps\' range';
      drawAll();
    });
    rangeBox.appendChild(button);
  }
  drawAll();
  FR.moveCrosshair = linkPlots(linked);
  await minutesBefore();

  // -- the minutes before: the stored steps, binned, beside the ring's last steps ---------------
  // The ring holds the last 4,096 steps (seconds at a fast engine); the ramp that led to the
  // fault is in the steps the sidecar stored, read back binned (GET .../before).
  async function minutesBefore() {
    const card = document.getElementById('before-card');
    let b;
    try { b = await api('/api/v1/snapshots/' + id + '/before?minutes=10'); } catch (err) { return; }
    const c = b.columns || {};
    const t = (c.t || []).map((x) => x - doc.fault_ts);
    card.hidden = false;
    const note = document.getElementById('before-note');
    if (!t.length) { note.textContent = 'no stored steps of ' + doc.engine + ' in the 10 minutes before the fault'; document.body.dataset.before = '0'; return; }
    const ringStart = steps.length ? rel(steps[0].ts) : null;
    note.textContent = t.length + ' bins of ' + fmt(b.bin_s) + ' s from the stored steps, ' + fmt(-t[0]) + ' s before the fault' +
      (ringStart !== null ? '; the last steps below cover only the final ' + fmt(-ringStart) + ' s' : '');
    const perS = (xs) => xs.map((v) => (v === null || v === undefined ? null : v / b.bin_s));
    const opts = { marker: 0, markerLabel: 'fault', xLabel: 'seconds from the fault', xFmt: (x) => (x >= 0 ? '+' : '') + x.toFixed(0) + ' s', yMin: 0 };
    const plots = [
      ['Running and waiting requests (max per bin)', [{ name: 'running', xs: t, ys: c.running }, { name: 'waiting', xs: t, ys: c.waiting }]],
      ['kv_cache_usage (max per bin)', [{ name: 'kv_cache_usage', xs: t, ys: c.kv_cache_usage }]],
      ['Tokens per second', [{ name: 'prefill', xs: t, ys: perS(c.prompt_tokens), color: '#ff7f0e' }, { name: 'decode', xs: t, ys: perS(c.generation_tokens), color: '#1f77b4' }]],
      ['Preemptions per second', [{ name: 'preemptions', xs: t, ys: perS(c.preemptions) }]],
    ];
    for (const [title, series] of plots) {
      const canvas = el('canvas', { 'data-plot': 'before: ' + title });
      const box = el('div', { class: 'plot' }, el('h3', {}, title), canvas);
      if (series.length > 1) box.appendChild(legend(series));
      document.getElementById('before-plots').appendChild(box);
      plot(canvas, series, opts);
    }
    document.body.dataset.before = String(t.length);
  }

  // -- times: log lines have one-second stamps ------------------------------------------------
  // vLLM's log stamps have no sub-second part, so an event seen only in a log happened within
  // the second after its stamp: shown as such (±1 s), and ordered by its best witness: the
  // recorder's step of the failing process when known (a step's error surfaces when the step
  // ends, so its witness is the next step's start), else the end of its second (a worker's CUDA
  // error stamped 10:41:07 is not before an Xid at 10:41:07.027).
  const isLogTime = (e) => (e.sources || [e.source]).every((x) => x === 'log');
  function witness(e) {
    if (!isLogTime(e)) return { key: e.ts, text: signed(rel(e.ts), 3) + ' s', by: e.source };
    const f = e.process ? failed[e.process] : null;
    const t = f && f.step !== null && f.step !== undefined ? stepTs.get(f.step + 1) : undefined;
    if (t !== undefined && t >= e.ts - 0.001 && t < e.ts + 1) return { key: t, text: signed(rel(t), 3) + ' s (step ' + f.step + ')', by: 'recorder step' };
    // the second its stamp names, as an interval from the fault: "-0.4 to +0.6 s (log time)"
    return { key: e.ts + 0.999, text: signed(rel(e.ts), 1) + ' to ' + signed(rel(e.ts) + 1, 1) + ' s (log time, 1 s stamp)', by: 'log stamp', approx: true };
  }
  function signed(v, digits) {
    const s = v.toFixed(digits);
    return (Number(s) === 0 ? '±' : v > 0 ? '+' : '') + s.replace(/^-(0\.?0*)$/, '$1');
  }
  const events = (doc.events || []).map((e) => ({ e, w: witness(e) })).sort((a, b) => a.w.key - b.w.key);

  // The Xid catalog's entry (collector/xid/catalog.json), as the kernel-log source attached it
  function xidInfo(e) {
    const c = e && e.data && e.data.catalog;
    if (!c) return null;
    return el('p', { class: 'xid-info' }, el('b', {}, 'Xid ' + c.code + ' · ' + c.name + ' (' + c.severity + ', ' + c.category + '): '),
      c.meaning + ' ', el('b', {}, 'Action: '), c.action + (c.known === false ? ' (not in the catalog)' : ''));
  }
  const faultXid = events.find(({ e }) => e.kind === 'xid' && e.data && e.data.catalog);
  if (faultXid && !document.getElementById('xid-action')) fault.appendChild(xidInfo(faultXid.e));

  // -- tracebacks -----------------------------------------------------------------------------
  const tb = document.getElementById('tracebacks');
  const loud = events.filter(({ e }) => (e.lines && e.lines.length > 1) || (e.frames && e.frames.length) || ['xid', 'cuda_error', 'nccl_error', 'engine_fatal', 'engine_dead', 'gpu_lost'].includes(e.kind));
  if (!loud.length) tb.appendChild(el('p', { class: 'missing' }, 'no failure recorded in the engine log'));
  for (const { e, w } of loud) {
    tb.appendChild(el('h3', {}, el('span', { class: 'fault-kind' }, e.kind), ' ', e.process ? e.process + (e.pid ? ' pid=' + e.pid : '') + ' · ' : '',
      el('span', { class: w.approx ? 'approx' : '', title: 'time by ' + w.by }, w.text), ' · ', e.message || ''));
    if (e.kind === 'xid') { const info = xidInfo(e); if (info) tb.appendChild(info); }
    let text = (e.lines || []).join('\n');
    if (!text && e.frames && e.frames.length) text = e.frames.map((f) => '  File "' + f.file + '", line ' + f.line + ', in ' + f.function + (f.code ? '\n    ' + f.code : '')).join('\n');
    if (text) tb.appendChild(el('pre', { class: 'log tb' }, text));
  }

  // -- requests at the last step --------------------------------------------------------------
  const reqCols = Object.keys(cols).filter((c) => c !== 'extras');
  const lastReqStep = rs.length ? rs[rs.length - 1] : null;
  document.getElementById('req-note').textContent = lastReqStep !== null ? 'step ' + lastReqStep : 'no per-request rows recorded';
  document.querySelector('#requests thead').appendChild(el('tr', {}, ...reqCols.map((c) => el('th', { class: c === 'request_id' || c === 'status' ? 'l' : '' }, c))));
  const rbody = document.querySelector('#requests tbody');
  const lastRows = [];
  for (let i = 0; i < rs.length; i++) if (rs[i] === lastReqStep) lastRows.push(i);
  lastRows.sort((a, b) => (ctx[b] ?? -1) - (ctx[a] ?? -1));  // the longest first, as the plot names them
  for (const i of lastRows) {
    const tr = el('tr', { class: 'pickable', title: 'draw this request in the context plot' }, ...reqCols.map((c) => el('td', { class: c === 'request_id' || c === 'status' ? 'l' : '' }, fmt(cols[c][i]))));
    tr.addEventListener('click', () => { showRequest(rid[i]); ctxPlot.canvas.scrollIntoView({ block: 'center' }); });
    rbody.appendChild(tr);
  }

  // -- events ---------------------------------------------------------------------------------
  const ehead = ['time from fault', 'kind', 'sources', 'process', 'xid', 'message'];
  document.querySelector('#events thead').appendChild(el('tr', {}, ...ehead.map((h) => el('th', { class: 'l' }, h))));
  const ebody = document.querySelector('#events tbody');
  for (const { e, w } of events) {
    ebody.appendChild(el('tr', {},
      el('td', { class: 'l' + (w.approx ? ' approx' : ''), title: 'time by ' + w.by }, w.text),
      el('td', { class: 'l' }, e.kind), el('td', { class: 'l' }, (e.sources || [e.source]).join(', ')),
      el('td', { class: 'l' }, e.process || ''), el('td', { class: 'l' }, fmt(e.xid)), el('td', { class: 'l' }, (e.message || '').slice(0, 300))));
  }

  // -- log and fingerprint --------------------------------------------------------------------
  const lines = doc.log_lines || [];
  const shown = lines.slice(-400);
  document.getElementById('log-note').textContent = lines.length ? 'last ' + shown.length + ' of ' + lines.length + ' lines' : 'no log lines recorded';
  document.getElementById('log').textContent = shown.map((l) => l.line).join('\n');
  const fpText = JSON.stringify(doc.fingerprint || {}, null, 2) + (doc.peers && doc.peers.length ? '\n\n// peers\n' + JSON.stringify(doc.peers, null, 2) : '');
  document.getElementById('fingerprint').textContent = fpText;
  document.body.dataset.ready = '1';
})();

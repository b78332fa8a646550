// The page of one crash snapshot: the fault, the triage checklist, plots of the last steps and
// of the GPUs with the fault marked, the tracebacks, the requests at the last step, the events,
// the log. Everything from /api/v1; every string reaches the DOM as text.
'use strict';

(async function main() {
  const { api, download, el, showError, isoTime, fmt, plot, legend } = FR;
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
    'fault at ' + isoTime(doc.fault_ts) + ' · incident ' + (doc.incident_id ?? '–') + ' · ',
    el('a', { href: '#', id: 'export', onclick: (ev) => { ev.preventDefault(); download('/api/v1/snapshots/' + id + '/export', 'flightrec-snapshot-' + id + '.json.gz').catch((e) => showError(status, e)); } }, 'download export (.json.gz)'),
    ' · ', el('a', { href: '/snapshots?incident_id=' + encodeURIComponent(doc.incident_id ?? '') }, 'snapshots of this incident'));
  document.getElementById('main').hidden = false;

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
  fault.append(
    el('h2', {}, el('span', { class: 'fault-kind' }, trig.kind || '?'), ' ', trig.message || ''),
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
  const tbody = document.querySelector('#checklist tbody');
  for (const item of checklist.items) {
    const value = el('td', { class: item.recorded ? '' : 'missing', 'data-key': item.key }, item.text);
    if (item.detail !== undefined && item.detail !== null) value.appendChild(el('div', { class: 'muted' }, fmt(item.detail)));
    tbody.appendChild(el('tr', {}, el('td', { class: 'check ' + (item.recorded ? 'ok' : 'missing') }, item.recorded ? '✓' : '✗'), el('th', {}, item.label), value));
  }

  // -- plots ----------------------------------------------------------------------------------
  function addPlot(containerId, title, series, opts, legendLimit) {
    const canvas = el('canvas', { 'data-plot': title });
    const box = el('div', { class: 'plot' }, el('h3', {}, title), canvas);
    if (series.length > 1) box.appendChild(legend(series, legendLimit));
    document.getElementById(containerId).appendChild(box);
    plot(canvas, series, opts);
  }
  const xs = steps.map((r) => r.step);
  const col = (name) => steps.map((r) => (r[name] === undefined ? null : r[name]));
  const stepOpts = { marker: faultStep, markerLabel: faultLabel, xLabel: 'engine step' };
  document.getElementById('steps-note').textContent = steps.length ? steps.length + ' steps, ' + isoTime(steps[0].ts) + ' → ' + isoTime(steps[steps.length - 1].ts) : 'no steps recorded';
  addPlot('step-plots', 'Running and waiting requests', [{ name: 'running', xs, ys: col('running') }, { name: 'waiting', xs, ys: col('waiting') }], { ...stepOpts, yMin: 0 });
  addPlot('step-plots', 'kv_cache_usage', [{ name: 'kv_cache_usage', xs, ys: col('kv_cache_usage') }], { ...stepOpts, yMin: 0 });
  addPlot('step-plots', 'Preemptions per step', [{ name: 'preemptions', xs, ys: col('preemptions') }], { ...stepOpts, yMin: 0 });
  addPlot('step-plots', 'Host-mirror rows (all requests)', [{ name: 'mirror rows', xs, ys: col('mirror_rows') }], { ...stepOpts, yMin: 0 });

  // per request: group the columns by request id
  const byReq = new Map();
  const rs = cols.step || [], rid = cols.request_id || [], ctx = cols.computed_tokens || [], mir = cols.mirror_rows || [];
  for (let i = 0; i < rs.length; i++) {
    let r = byReq.get(rid[i]);
    if (!r) { r = { xs: [], ctx: [], mir: [] }; byReq.set(rid[i], r); }
    r.xs.push(rs[i]); r.ctx.push(ctx[i]); r.mir.push(mir[i] ?? null);
  }
  const ctxSeries = [], mirSeries = [];
  for (const [name, r] of byReq) {
    ctxSeries.push({ name, xs: r.xs, ys: r.ctx });
    mirSeries.push({ name, xs: r.xs, ys: r.mir });
  }
  addPlot('step-plots', 'Context length per request (computed tokens)', ctxSeries, stepOpts, 8);
  addPlot('step-plots', 'Host-mirror rows per request', mirSeries, { ...stepOpts, yMin: 0 }, 8);

  // GPUs: seconds relative to the fault
  const gpus = new Map();
  for (const g of doc.gpu_samples || []) {
    const key = g.gpu + (g.index !== undefined ? ' (GPU ' + g.index + ')' : '');
    if (!gpus.has(key)) gpus.set(key, []);
    gpus.get(key).push(g);
  }
  document.getElementById('gpu-note').textContent = gpus.size ? (doc.gpu_samples.length + ' samples of ' + gpus.size + ' GPU(s), seconds relative to the fault') : 'no GPU samples recorded';
  const gpuSeries = (field, scale) => [...gpus].map(([name, samples]) => ({
    name, xs: samples.map((g) => g.ts - doc.fault_ts), ys: samples.map((g) => (g[field] === null || g[field] === undefined ? null : g[field] * (scale || 1))),
  }));
  const gpuOpts = { marker: 0, markerLabel: 'fault', xLabel: 'seconds from the fault' };
  addPlot('gpu-plots', 'GPU utilisation (%)', gpuSeries('utilization'), { ...gpuOpts, yMin: 0 });
  addPlot('gpu-plots', 'GPU memory used (GiB)', gpuSeries('memory_used', 1 / 2 ** 30), { ...gpuOpts, yMin: 0 });
  addPlot('gpu-plots', 'GPU temperature (°C)', gpuSeries('temperature'), gpuOpts);
  addPlot('gpu-plots', 'GPU power (W)', gpuSeries('power_w'), { ...gpuOpts, yMin: 0 });

  // -- tracebacks -----------------------------------------------------------------------------
  const tb = document.getElementById('tracebacks');
  const events = doc.events || [];
  const loud = events.filter((e) => (e.lines && e.lines.length > 1) || (e.frames && e.frames.length) || ['xid', 'cuda_error', 'nccl_error', 'engine_fatal', 'engine_dead', 'gpu_lost'].includes(e.kind));
  if (!loud.length) tb.appendChild(el('p', { class: 'missing' }, 'no failure recorded in the engine log'));
  for (const e of loud) {
    const rel = (e.ts - doc.fault_ts).toFixed(3);
    tb.appendChild(el('h3', {}, el('span', { class: 'fault-kind' }, e.kind), ' ', e.process ? e.process + (e.pid ? ' pid=' + e.pid : '') + ' · ' : '', (rel >= 0 ? '+' : '') + rel + ' s · ', e.message || ''));
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
  for (let i = 0; i < rs.length; i++) {
    if (rs[i] !== lastReqStep) continue;
    rbody.appendChild(el('tr', {}, ...reqCols.map((c) => el('td', { class: c === 'request_id' || c === 'status' ? 'l' : '' }, fmt(cols[c][i])))));
  }

  // -- events ---------------------------------------------------------------------------------
  const ehead = ['time from fault', 'kind', 'sources', 'process', 'xid', 'message'];
  document.querySelector('#events thead').appendChild(el('tr', {}, ...ehead.map((h) => el('th', { class: 'l' }, h))));
  const ebody = document.querySelector('#events tbody');
  for (const e of events) {
    ebody.appendChild(el('tr', {},
      el('td', { class: 'l' }, ((e.ts - doc.fault_ts) >= 0 ? '+' : '') + (e.ts - doc.fault_ts).toFixed(3) + ' s'),
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

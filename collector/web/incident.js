// The page of one incident: its title, the hosts and engines involved (P/D peers), one timeline
// of every witness across engines and hosts (a lane per engine, and one per host for what the
// host saw: kernel log, NVML), its snapshots, the alerts its events page with, its replays.
// Everything from /api/v1/incidents/{id}/view; every string reaches the DOM as text.
'use strict';

(async function main() {
  const { api, el, showError, isoTime, fmt } = FR;
  const id = document.body.dataset.incidentId;
  const status = document.getElementById('status');
  let inc;
  try {
    inc = await api('/api/v1/incidents/' + id + '/view');
  } catch (err) {
    showError(status, err);
    return;
  }
  document.title = 'Flight recorder: incident ' + id;
  document.getElementById('title').textContent = 'Incident ' + id + ': ' + inc.title;
  const t0 = inc.first_fault_ts ?? inc.opened_at;
  const rel = (ts) => (ts === null || ts === undefined ? '' : (ts - t0 >= 0 ? '+' : '') + (ts - t0).toFixed(3) + ' s');
  status.replaceChildren('first fault at ' + isoTime(t0) + ' · ' + inc.hosts.length + ' host(s) · ' + inc.engines.length + ' engine(s) · ' +
    inc.snapshots.length + ' snapshot(s) · ', el('a', { href: '/snapshots?incident_id=' + id }, 'in the snapshot list'));
  document.getElementById('main').hidden = false;
  const head = (table, names) => document.querySelector('#' + table + ' thead').appendChild(el('tr', {}, ...names.map((h) => el('th', { class: 'l' }, h))));
  const snapLinks = (ids) => { const span = el('span'); ids.forEach((s, k) => { if (k) span.append(', '); span.appendChild(el('a', { href: '/snapshots/' + s }, '#' + s)); }); return span; };

  // -- hosts and engines ------------------------------------------------------------------------
  const roles = { kv_producer: 'prefill (kv_producer)', kv_consumer: 'decode (kv_consumer)', kv_both: 'kv_both' };
  const pairs = Object.entries(inc.pairs || {});
  document.getElementById('engines-note').textContent = pairs.length ? 'P/D pairs: ' + pairs.map(([p, es]) => p + ' = ' + es.join(' + ')).join('; ') : 'no P/D pair';
  head('engines', ['host', 'engine', 'pair', 'role', 'vLLM', 'snapshots']);
  const ebody = document.querySelector('#engines tbody');
  for (const e of inc.engines) {
    ebody.appendChild(el('tr', {}, el('td', { class: 'l' }, e.host), el('td', { class: 'l' }, e.engine), el('td', { class: 'l' }, e.pair || ''),
      el('td', { class: 'l' }, roles[e.role] || e.role || ''), el('td', { class: 'l' }, e.vllm_version || ''),
      el('td', { class: 'l' }, e.snapshots.length ? snapLinks(e.snapshots) : el('span', { class: 'muted' }, 'peer, no snapshot'))));
  }

  // -- one timeline -----------------------------------------------------------------------------
  const events = inc.timeline || [];
  document.getElementById('timeline-note').textContent = events.length + ' events, seconds from the first fault; log-only times are ±1 s (one-second stamps)';
  drawLanes(document.getElementById('timeline-lanes'), events);
  head('timeline', ['time', 'host', 'engine', 'kind', 'witnesses', 'process', 'message', 'snapshots']);
  const tbody = document.querySelector('#timeline tbody');
  for (const e of events) {
    const logOnly = (e.sources || []).every((x) => x === 'log');
    tbody.appendChild(el('tr', { 'data-kind': e.kind },
      el('td', { class: 'l' + (logOnly ? ' approx' : '') }, rel(e.ts) + (logOnly ? ' ±1 s' : '')), el('td', { class: 'l' }, e.host || ''),
      el('td', { class: 'l' }, e.engine || '(host)'), el('td', { class: 'l' }, el('span', { class: 'kind kind-' + e.kind }, e.kind)),
      el('td', { class: 'l' }, (e.sources || []).join(', ')), el('td', { class: 'l' }, e.process || ''),
      el('td', { class: 'l' }, (e.xid !== null && e.xid !== undefined ? 'Xid ' + e.xid + (e.xid_name ? ' (' + e.xid_name + ') ' : ' ') : '') + (e.message || '').slice(0, 240),
        (e.gpu_holders || []).length ? el('div', { class: 'muted gpu-holders' }, 'GPU held by ' + e.gpu_holders.map((h) => h.namespace + '/' + h.pod + (h.container ? ' (' + h.container + ')' : '')).join(', ')) : null),
      el('td', { class: 'l' }, snapLinks(e.snapshots || []))));
  }

  // -- snapshots, alerts, replays ---------------------------------------------------------------
  head('snapshots', ['id', 'host', 'engine', 'trigger', 'fault', 'steps', 'request rows']);
  const sbody = document.querySelector('#snapshots tbody');
  for (const s of inc.snapshots) {
    sbody.appendChild(el('tr', {}, el('td', { class: 'l' }, el('a', { href: '/snapshots/' + s.id }, '#' + s.id)), el('td', { class: 'l' }, s.host),
      el('td', { class: 'l' }, s.engine), el('td', { class: 'l' }, (s.trigger_kind || '') + ': ' + (s.trigger_message || '').slice(0, 120)),
      el('td', { class: 'l' }, rel(s.fault_ts)), el('td', {}, fmt(s.step_count)), el('td', {}, fmt(s.request_rows))));
  }
  head('alerts', ['from', 'alertname', 'severity', 'labels', 'summary']);
  const abody = document.querySelector('#alerts tbody');
  if (!inc.alerts.length) abody.appendChild(el('tr', {}, el('td', { class: 'l muted', colspan: 5 }, 'none of these events pages on its own')));
  for (const a of inc.alerts) {
    const labels = Object.entries(a.labels).filter(([k]) => k !== 'alertname' && k !== 'severity').map(([k, v]) => k + '=' + v).join(' ');
    abody.appendChild(el('tr', {}, el('td', { class: 'l' }, rel(a.starts_at)), el('td', { class: 'l' }, a.alertname),
      el('td', { class: 'l sev-' + a.severity }, a.severity), el('td', { class: 'l' }, labels), el('td', { class: 'l' }, a.summary || '')));
  }
  const rbox = document.getElementById('replays');
  if (!inc.replays.length) rbox.appendChild(el('p', { class: 'muted' }, 'no replay linked yet: flightrec replay SNAPSHOT_ID --target URL links one'));
  for (const r of inc.replays) {
    rbox.appendChild(el('p', {}, isoTime(r.ts) + ' · replay of ', el('a', { href: '/snapshots/' + r.of_snapshot }, 'snapshot #' + r.of_snapshot),
      ' (' + r.engine + ') at speed ' + fmt(r.speed) + ': ' + (r.died ? 'the engine died in phase ' + r.died_phase + ' (C' + r.died_concurrency + ')' : 'the engine survived'),
      r.snapshot_id ? el('span', {}, ' · its snapshot ', el('a', { href: '/snapshots/' + r.snapshot_id }, '#' + r.snapshot_id)) : null));
  }
  document.body.dataset.ready = '1';

  // A lane per engine (and per host for its own witnesses), the events as marks on one axis
  // of seconds from the first fault; crashes red, Xids purple, detectors amber, the rest grey.
  function drawLanes(canvas, evs) {
    const lanes = [];
    const laneOf = (e) => (e.engine ? e.host + ' / ' + e.engine : e.host + ' (host: kernel log, NVML)');
    for (const e of evs) if (!lanes.includes(laneOf(e))) lanes.push(laneOf(e));
    lanes.sort();
    const dpr = window.devicePixelRatio || 1;
    const cssW = canvas.clientWidth || 900, laneH = 26, pad = { l: 260, r: 20, t: 22, b: 30 };
    const cssH = pad.t + pad.b + Math.max(1, lanes.length) * laneH;
    canvas.style.height = cssH + 'px';
    canvas.width = Math.round(cssW * dpr); canvas.height = Math.round(cssH * dpr);
    const g = canvas.getContext('2d');
    g.setTransform(dpr, 0, 0, dpr, 0, 0);
    g.fillStyle = '#fff'; g.fillRect(0, 0, cssW, cssH);
    g.font = '11px system-ui, sans-serif';
    const ts = evs.map((e) => e.ts - t0).filter((x) => isFinite(x));
    if (!ts.length) { g.fillStyle = '#b00'; g.fillText('no events recorded', pad.l, pad.t + 14); canvas.dataset.drawn = '0'; return; }
    let lo = Math.min(0, ...ts), hi = Math.max(0, ...ts);
    const span = Math.max(hi - lo, 1); lo -= span * 0.03; hi += span * 0.03;
    const W = cssW - pad.l - pad.r;
    const X = (x) => pad.l + ((x - lo) / (hi - lo)) * W;
    lanes.forEach((name, k) => {
      const y = pad.t + k * laneH;
      g.fillStyle = k % 2 ? '#fafafa' : '#f1f3f6'; g.fillRect(pad.l, y, W, laneH);
      g.fillStyle = '#333'; g.textAlign = 'right'; g.textBaseline = 'middle';
      g.fillText(name.length > 42 ? name.slice(0, 41) + '…' : name, pad.l - 6, y + laneH / 2);
    });
    g.textAlign = 'center'; g.textBaseline = 'top'; g.strokeStyle = '#ddd';
    const step = Math.pow(10, Math.floor(Math.log10(span))) / (span / Math.pow(10, Math.floor(Math.log10(span))) < 3 ? 2 : 1);
    for (let v = Math.ceil(lo / step) * step; v <= hi; v += step) {
      const x = Math.round(X(v)) + 0.5;
      g.beginPath(); g.moveTo(x, pad.t); g.lineTo(x, pad.t + lanes.length * laneH); g.stroke();
      g.fillStyle = '#444'; g.fillText((v >= 0 ? '+' : '') + (+v.toPrecision(6)) + ' s', x, pad.t + lanes.length * laneH + 4);
    }
    const colour = (k) => ({ xid: '#7b2cbf', gpu_lost: '#7b2cbf', cuda_error: '#d00', nccl_error: '#d00', engine_fatal: '#d00', engine_dead: '#d00',
      engine_down: '#a33', anomaly: '#e69500', crash_dump: '#555', manual: '#1f77b4' }[k] || '#888');
    let drawnMarks = 0;
    for (const e of evs) {
      const x = X(e.ts - t0), y = pad.t + lanes.indexOf(laneOf(e)) * laneH + laneH / 2;
      const logOnly = (e.sources || []).every((s) => s === 'log');
      g.fillStyle = colour(e.kind);
      if (logOnly) { g.globalAlpha = 0.25; g.fillRect(x, y - 7, Math.max(2, X(e.ts - t0 + 1) - x), 14); g.globalAlpha = 1; }  // the second it may be in
      g.beginPath(); g.arc(x, y, 5, 0, 2 * Math.PI); g.fill();
      drawnMarks++;
    }
    const x0 = Math.round(X(0)) + 0.5;
    g.strokeStyle = '#d00'; g.setLineDash([5, 3]); g.lineWidth = 1.5;
    g.beginPath(); g.moveTo(x0, pad.t - 4); g.lineTo(x0, pad.t + lanes.length * laneH); g.stroke(); g.setLineDash([]);
    g.fillStyle = '#d00'; g.font = 'bold 11px system-ui, sans-serif'; g.textAlign = 'left'; g.textBaseline = 'top';
    g.fillText('first fault', x0 + 4, 4);
    canvas.dataset.drawn = String(drawnMarks);
    canvas.dataset.lanes = String(lanes.length);
  }
})();

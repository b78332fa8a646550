// Shared by the flight recorder's pages: the API client (bearer token from ?token= kept in
// sessionStorage), safe DOM building (text only: log lines and messages are untrusted), and a
// small canvas line plot. No outside code: the pages must work on a closed network.
'use strict';

const FR = (() => {
  const TOKEN_KEY = 'flightrec.token';

  // ?token=... is taken once, kept for this tab only, and removed from the address bar.
  (function takeToken() {
    const url = new URL(location.href);
    const token = url.searchParams.get('token');
    if (token) {
      sessionStorage.setItem(TOKEN_KEY, token);
      url.searchParams.delete('token');
      history.replaceState(null, '', url.pathname + url.search + url.hash);
    }
  })();

  class ApiError extends Error {
    constructor(status, message) { super(message); this.status = status; }
  }

  function authHeaders() {
    const token = sessionStorage.getItem(TOKEN_KEY);
    return token ? { Authorization: 'Bearer ' + token } : {};
  }

  async function api(path) {
    const resp = await fetch(path, { headers: authHeaders() });
    if (!resp.ok) {
      let detail = resp.statusText;
      try { detail = (await resp.json()).detail || detail; } catch (e) { /* not JSON */ }
      throw new ApiError(resp.status, typeof detail === 'string' ? detail : JSON.stringify(detail));
    }
    return resp.json();
  }

  async function download(path, filename) {
    const resp = await fetch(path, { headers: authHeaders() });
    if (!resp.ok) throw new ApiError(resp.status, 'download failed: ' + resp.status);
    const blob = await resp.blob();
    const a = el('a', { href: URL.createObjectURL(blob), download: filename });
    document.body.appendChild(a);
    a.click();
    a.remove();
  }

  // el('td', {class: 'x'}, 'text', child...): attributes and text nodes only, never HTML.
  function el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v === undefined || v === null) continue;
      if (k === 'class') node.className = v;
      else if (k === 'onclick') node.addEventListener('click', v);
      else node.setAttribute(k, String(v));
    }
    for (const c of children) {
      if (c === undefined || c === null) continue;
      node.appendChild(c instanceof Node ? c : document.createTextNode(String(c)));
    }
    return node;
  }

  // Errors are shown on the page; auth failures offer a token form.
  function showError(container, err) {
    container.replaceChildren();
    if (err instanceof ApiError && (err.status === 401 || err.status === 403)) {
      const input = el('input', { type: 'password', id: 'token-input', placeholder: 'API token', size: 40 });
      const form = el('form', { id: 'token-form' }, el('p', {}, 'This sidecar needs its API token to be read (' + err.message + ').'),
        input, ' ', el('button', { type: 'submit' }, 'Use token'));
      form.addEventListener('submit', (ev) => {
        ev.preventDefault();
        sessionStorage.setItem(TOKEN_KEY, input.value.trim());
        location.reload();
      });
      container.appendChild(form);
      return;
    }
    container.appendChild(el('p', { class: 'error' }, String(err && err.message ? err.message : err)));
  }

  function isoTime(ts) {
    if (ts === null || ts === undefined) return '';
    return new Date(ts * 1000).toISOString().replace('T', ' ').replace('Z', ' UTC');
  }

  function fmt(v) {
    if (v === null || v === undefined) return '';
    if (typeof v === 'number') {
      if (Number.isInteger(v)) return String(v);
      const a = Math.abs(v);
      return a !== 0 && (a < 0.01 || a >= 1e6) ? v.toExponential(2) : String(+v.toPrecision(4));
    }
    if (Array.isArray(v)) return v.map(fmt).join(', ');
    if (typeof v === 'object') return Object.entries(v).map(([k, x]) => k + ': ' + (x !== null && typeof x === 'object' ? '(' + fmt(x) + ')' : fmt(x))).join(' · ');
    return String(v);
  }

  // -- plotting -------------------------------------------------------------------------------
  const PALETTE = ['#1f77b4', '#ff7f0e', '#2ca02c', '#9467bd', '#8c564b', '#e377c2', '#17becf', '#bcbd22', '#7f7f7f'];

  function niceStep(lo, hi, n) {
    if (!(hi > lo)) { hi = lo + 1; }
    const raw = (hi - lo) / n;
    const mag = Math.pow(10, Math.floor(Math.log10(raw)));
    return [1, 2, 2.5, 5, 10].map((m) => m * mag).find((s) => s >= raw) || 10 * mag;
  }

  function niceTicks(lo, hi, n) {
    if (!(hi > lo)) { hi = lo + 1; }
    const step = niceStep(lo, hi, n);
    const out = [];
    for (let v = Math.ceil(lo / step) * step; v <= hi + step * 1e-9; v += step) out.push(+v.toPrecision(12));
    return out;
  }

  // series: [{name, xs, ys, color?, width?}] (xs ascending), or a band {name, xs, lo, hi, fill}
  // drawn as the area between lo and hi; opts: {marker: x of the fault, markerLabel, xLabel,
  // yFmt, yMin, xRange: [lo, hi] shared by linked plots}. Keeps what the crosshair needs on the
  // canvas: the scales, the series and the drawn image, so hovering repaints one line.
  function plot(canvas, series, opts) {
    opts = opts || {};
    const dpr = window.devicePixelRatio || 1;
    const cssW = canvas.clientWidth || 460, cssH = canvas.clientHeight || 220;
    canvas.width = Math.round(cssW * dpr);
    canvas.height = Math.round(cssH * dpr);
    const g = canvas.getContext('2d');
    g.setTransform(dpr, 0, 0, dpr, 0, 0);
    g.fillStyle = '#fff';
    g.fillRect(0, 0, cssW, cssH);
    const pad = { l: 56, r: 16, t: 18, b: 34 };
    const W = cssW - pad.l - pad.r, H = cssH - pad.t - pad.b;
    const range = opts.xRange && isFinite(opts.xRange[0]) && isFinite(opts.xRange[1]) ? opts.xRange : null;
    const inRange = (x) => !range || (x >= range[0] && x <= range[1]);
    let xlo = range ? range[0] : Infinity, xhi = range ? range[1] : -Infinity;
    let ylo = opts.yMin !== undefined ? opts.yMin : Infinity, yhi = -Infinity;
    let points = 0, seen = 0;
    for (const s of series) {
      for (const ys of s.lo ? [s.lo, s.hi] : [s.ys]) {
        for (let i = 0; i < s.xs.length; i++) {
          const x = s.xs[i], y = ys[i];
          if (y === null || y === undefined || !isFinite(y) || !isFinite(x) || !inRange(x)) continue;
          seen++;
          if (!range) { if (x < xlo) xlo = x; if (x > xhi) xhi = x; }
          if (y < ylo) ylo = y; if (y > yhi) yhi = y;
        }
      }
    }
    if (!range && opts.marker !== undefined && opts.marker !== null && isFinite(opts.marker)) {
      xlo = Math.min(xlo, opts.marker); xhi = Math.max(xhi, opts.marker);
    }
    g.font = '11px system-ui, sans-serif';
    canvas._fr = null;
    if (!seen || !isFinite(xlo) || !isFinite(ylo)) {
      g.fillStyle = '#b00';
      g.fillText(opts.empty || 'no data recorded', pad.l + 10, pad.t + 20);
      canvas.dataset.drawn = '0';
      return 0;
    }
    if (yhi <= ylo) { yhi = ylo + (Math.abs(ylo) || 1); }
    if (xhi <= xlo) { xhi = xlo + 1; }
    yhi += (yhi - ylo) * 0.05;
    // the axis starts and ends on a tick: the lowest value has a labelled tick under it
    const yStep = niceStep(ylo, yhi, 4);
    ylo = Math.floor(ylo / yStep + 1e-9) * yStep;
    yhi = Math.max(Math.ceil(yhi / yStep - 1e-9) * yStep, ylo + yStep);
    const X = (x) => pad.l + ((x - xlo) / (xhi - xlo)) * W;
    const Y = (y) => pad.t + H - ((y - ylo) / (yhi - ylo)) * H;
    g.strokeStyle = '#e6e6e6'; g.lineWidth = 1; g.fillStyle = '#444';
    g.textAlign = 'right'; g.textBaseline = 'middle';
    const yf = opts.yFmt || fmt;
    for (const t of niceTicks(ylo, yhi, 4)) {
      const y = Math.round(Y(t)) + 0.5;
      g.beginPath(); g.moveTo(pad.l, y); g.lineTo(pad.l + W, y); g.stroke();
      g.fillText(yf(t), pad.l - 4, y);
    }
    g.textAlign = 'center'; g.textBaseline = 'top';
    for (const t of niceTicks(xlo, xhi, 5)) {
      const x = Math.round(X(t)) + 0.5;
      g.beginPath(); g.moveTo(x, pad.t); g.lineTo(x, pad.t + H); g.stroke();
      g.fillText(fmt(t), x, pad.t + H + 3);
    }
    if (opts.xLabel) g.fillText(opts.xLabel, pad.l + W / 2, pad.t + H + 18);
    g.strokeStyle = '#888';
    g.strokeRect(pad.l + 0.5, pad.t + 0.5, W, H);
    g.save();
    g.beginPath(); g.rect(pad.l, pad.t, W, H); g.clip();
    // bands first (under the lines): the area between lo and hi, thinned like the lines
    for (const s of series) {
      if (!s.lo) continue;
      const n = s.xs.length, stride = Math.max(1, Math.floor(n / (W * 2)));
      const idx = [];
      for (let i = 0; i < n; i += stride) if (isFinite(s.xs[i]) && inRange(s.xs[i]) && s.lo[i] !== null && s.hi[i] !== null) idx.push(i);
      if (!idx.length) continue;
      g.fillStyle = s.fill || 'rgba(31,119,180,0.18)';
      g.beginPath();
      idx.forEach((i, j) => { const px = X(s.xs[i]), py = Y(s.hi[i]); if (j) g.lineTo(px, py); else g.moveTo(px, py); });
      for (let j = idx.length - 1; j >= 0; j--) g.lineTo(X(s.xs[idx[j]]), Y(s.lo[idx[j]]));
      g.closePath(); g.fill();
      points += idx.length;
    }
    // lines, thinned to about two points per pixel
    series.forEach((s, k) => {
      if (s.lo) return;
      const n = s.xs.length;
      const stride = Math.max(1, Math.floor(n / (W * 2)));
      g.strokeStyle = s.color || PALETTE[k % PALETTE.length];
      g.lineWidth = s.width || (series.length > 8 ? 1 : 1.6);
      g.beginPath();
      let pen = false;
      const idx = [];
      for (let i = 0; i < n; i += stride) idx.push(i);
      if (n > 0 && idx[idx.length - 1] !== n - 1) idx.push(n - 1);
      for (const i of idx) {
        const y = s.ys[i];
        if (y === null || y === undefined || !isFinite(y) || !inRange(s.xs[i])) { pen = false; continue; }
        const px = X(s.xs[i]), py = Y(y);
        if (pen) g.lineTo(px, py); else { g.moveTo(px, py); pen = true; }
        points++;
      }
      if (n === 1 && inRange(s.xs[0])) { g.fillStyle = g.strokeStyle; g.fillRect(X(s.xs[0]) - 2, Y(s.ys[0]) - 2, 4, 4); }
      g.stroke();
    });
    g.restore();
    if (opts.marker !== undefined && opts.marker !== null && isFinite(opts.marker)) {
      const x = Math.round(X(opts.marker)) + 0.5;
      g.strokeStyle = '#d00'; g.lineWidth = 2; g.setLineDash([5, 3]);
      g.beginPath(); g.moveTo(x, pad.t); g.lineTo(x, pad.t + H); g.stroke();
      g.setLineDash([]);
      g.font = 'bold 11px system-ui, sans-serif';
      const labelW = g.measureText(opts.markerLabel || 'fault').width;
      g.fillStyle = '#d00'; g.textAlign = x > pad.l + W - labelW - 8 ? 'right' : 'left'; g.textBaseline = 'top';
      g.fillText(opts.markerLabel || 'fault', x + (g.textAlign === 'right' ? -4 : 4), 3);
    }
    canvas._fr = { series, X, Y, xlo, xhi, pad, W, H, dpr, opts, base: g.getImageData(0, 0, canvas.width, canvas.height) };
    canvas.dataset.drawn = String(points);
    return points;
  }

  // The sample of a series nearest to x (xs ascending), or null when the nearest is farther
  // than twice the series' mean spacing or `tol` (no value is invented inside a gap).
  function nearest(s, x, tol) {
    const xs = s.xs, n = xs.length;
    if (!n) return null;
    let lo = 0, hi = n - 1;
    while (hi - lo > 1) { const mid = (lo + hi) >> 1; if (xs[mid] < x) lo = mid; else hi = mid; }
    const i = Math.abs(xs[lo] - x) <= Math.abs(xs[hi] - x) ? lo : hi;
    const gap = n > 1 ? (xs[n - 1] - xs[0]) / (n - 1) : Infinity;
    if (Math.abs(xs[i] - x) > Math.max(gap * 2, tol || 0, 1e-9)) return null;
    const y = s.ys[i];
    return y === null || y === undefined || !isFinite(y) ? null : { x: xs[i], y };
  }

  // Paint the shared crosshair at x on one plot, and say the values under it in `readout`.
  function crosshair(canvas, x, readout) {
    const st = canvas._fr;
    if (!st) return;
    const g = canvas.getContext('2d');
    g.putImageData(st.base, 0, 0);
    if (x === null || x < st.xlo || x > st.xhi) {
      canvas.dataset.crosshair = '';
      if (readout) readout.textContent = '';
      return;
    }
    g.setTransform(st.dpr, 0, 0, st.dpr, 0, 0);
    const px = Math.round(st.X(x)) + 0.5;
    g.strokeStyle = '#333'; g.lineWidth = 1;
    g.beginPath(); g.moveTo(px, st.pad.t); g.lineTo(px, st.pad.t + st.H); g.stroke();
    const values = [];
    st.series.forEach((s, k) => {
      if (s.lo) return;  // a band is read through its lines (p50, p90...)
      const hit = nearest(s, x, 0.02 * (st.xhi - st.xlo));  // within 2% of the axis: a gap reads "no sample"
      if (!hit) return;
      g.fillStyle = s.color || PALETTE[k % PALETTE.length];
      g.beginPath(); g.arc(st.X(hit.x), st.Y(hit.y), 3, 0, 2 * Math.PI); g.fill();
      values.push([s.name, hit.y]);
    });
    canvas.dataset.crosshair = String(x);
    if (readout) {
      const shown = values.slice(0, 6).map(([n, v]) => n + ' ' + (st.opts.yFmt || fmt)(v));
      readout.textContent = (st.opts.xFmt || fmt)(x) + ': ' + (shown.join(' · ') || 'no sample here') +
        (values.length > 6 ? ' · +' + (values.length - 6) + ' more' : '');
    }
  }

  // One crosshair for a group of plots drawn on the same x axis: moving over any of them moves
  // it on all, each with the values under it.
  function linkPlots(boxes) {
    const move = (x) => { for (const b of boxes) crosshair(b.canvas, x, b.readout); };
    for (const b of boxes) {
      b.canvas.addEventListener('mousemove', (ev) => {
        const st = b.canvas._fr;
        if (!st) return;
        const r = b.canvas.getBoundingClientRect();
        const px = ev.clientX - r.left;
        if (px < st.pad.l || px > st.pad.l + st.W) { move(null); return; }
        move(st.xlo + ((px - st.pad.l) / st.W) * (st.xhi - st.xlo));
      });
      b.canvas.addEventListener('mouseleave', () => move(null));
    }
    return move;
  }

  function legend(series, limit, title) {
    const box = el('div', { class: 'legend' });
    if (title) box.appendChild(el('span', { class: 'legend-title' }, title));
    series.slice(0, limit || 12).forEach((s, k) => {
      const swatch = el('i', s.lo ? { class: 'band' } : {});
      swatch.style.background = s.lo ? (s.fill || 'rgba(31,119,180,0.18)') : (s.color || PALETTE[k % PALETTE.length]);  // CSSOM: allowed by the page's CSP
      box.appendChild(el('span', { class: 'key' }, swatch, s.name));
    });
    if (series.length > (limit || 12)) box.appendChild(el('span', { class: 'key' }, '+' + (series.length - (limit || 12)) + ' more'));
    return box;
  }

  return { api, download, el, showError, isoTime, fmt, plot, legend, linkPlots, crosshair, nearest, PALETTE, ApiError };
})();

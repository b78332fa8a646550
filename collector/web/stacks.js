// A wedged engine's stacks on its snapshot page (the snapshot's `stacks` part, schema
// flightrec.stacks/v1): one collapsed block per process, its blocking frame on the block's own
// line; inside, its threads, the lead one first, each frame marked as moved or not between the
// two dumps; then what NVML said of the GPUs at each dump and the engine's NCCL/CUDA environment.
// Every string reaches the DOM as text (FR.el).
'use strict';

const FRStacks = (() => {
  const { el, fmt } = FR;

  function frameText(f) {
    return f ? f.function + ' (' + f.file + (f.line ? ':' + f.line : '') + ')' : '';
  }

  // py-spy's order, innermost first; '=' did not move between the dumps, '~' moved, '·' native
  function framesText(frames) {
    return frames.map((f) => (f.native ? '· ' : f.moved === false ? '= ' : f.moved === true ? '~ ' : '  ') + frameText(f)).join('\n');
  }

  function thread(t, open) {
    const b = t.blocking !== null && t.blocking !== undefined ? t.frames[t.blocking] : null;
    const head = el('summary', {},
      el('span', { class: 'state state-' + t.state }, t.state), ' ',
      el('b', {}, t.name || 'thread'), ' ', el('span', { class: 'muted' }, 'tid ' + t.tid + (t.main ? ' · main' : '') + (t.owns_gil ? ' · holds the GIL' : '')),
      b ? el('span', { class: 'blocking' }, ' at ' + frameText(b)) : null);
    const body = [el('pre', { class: 'log stack' }, framesText(t.frames))];
    if (t.first_frames) body.push(el('div', { class: 'muted' }, 'first dump:'), el('pre', { class: 'log stack' }, framesText(t.first_frames)));
    return el('details', Object.assign({ class: 'thread', 'data-state': t.state }, open ? { open: '' } : {}), head, ...body);
  }

  function process(p) {
    const b = p.blocking;
    const dumps = (p.dumps || []).map((d) => (d.error ? 'failed: ' + d.error : fmt(d.seconds) + ' s' + (d.native ? ' native' : ''))).join(' · ');
    const head = el('summary', {},
      el('span', { class: 'state state-' + p.state }, p.state), ' ',
      el('b', {}, p.role), ' ', p.title, ' ', el('span', { class: 'muted' }, 'pid ' + p.pid + (p.own_pid !== p.pid ? ' (' + p.own_pid + ' in its namespace)' : '')),
      b ? el('div', { class: 'blocking' }, 'blocked at ' + frameText(b.frame) + (b.in ? ' in ' + frameText(b.in) : '') + ' · thread ' + (b.thread || b.tid)) : null);
    const body = [el('div', { class: 'muted' }, 'dumps: ' + (dumps || 'none'))];
    if (p.env && Object.keys(p.env).length) body.push(el('div', { class: 'muted' }, 'environment differs: ' + Object.entries(p.env).map(([k, v]) => k + '=' + (v ?? '(unset)')).join(' ')));
    (p.threads || []).forEach((t, i) => body.push(thread(t, i === 0 && t.state === 'stuck')));
    return el('details', { class: 'process', 'data-role': p.role, 'data-state': p.state }, head, ...body);
  }

  function gpuTable(gpus) {
    const t = el('table', { class: 'grid', id: 'stacks-gpus' });
    t.appendChild(el('tr', {}, ...['GPU', 'utilisation % per dump', 'memory used (GiB)', 'power (W)', 'SM clock (MHz)', 'processes', ''].map((h) => el('th', { class: 'l' }, h))));
    for (const g of gpus) {
      const last = [...(g.readings || [])].reverse().find((r) => r) || {};
      t.appendChild(el('tr', {},
        el('td', { class: 'l' }, 'GPU ' + g.index + (g.name ? ' ' + g.name : '')),
        el('td', { class: 'l' }, (g.readings || []).map((r) => (r ? fmt(r.utilization) : '–')).join(' → ')),
        el('td', { class: 'l' }, last.memory_used !== null && last.memory_used !== undefined ? (last.memory_used / 2 ** 30).toFixed(1) : '–'),
        el('td', { class: 'l' }, fmt(last.power_w)), el('td', { class: 'l' }, fmt(last.sm_clock_mhz)),
        el('td', { class: 'l' }, (g.processes || []).map((p) => (p.role || '?') + ' ' + p.pid).join(', ')),
        el('td', { class: 'l' }, g.hint || '')));
    }
    return t;
  }

  function render(card, stacks, faultTs) {
    const when = stacks.started_at ? ', first dump ' + (stacks.started_at - faultTs >= 0 ? '+' : '') + (stacks.started_at - faultTs).toFixed(1) + ' s from the trigger' : '';
    const tool = stacks.tool && stacks.tool.version ? ', py-spy ' + stacks.tool.version : '';
    card.appendChild(el('p', { id: 'stacks-status' }, el('b', {}, stacks.status), ' · two dumps ' + fmt(stacks.interval_s) + ' s apart' + when + tool));
    for (const r of stacks.reasons || []) card.appendChild(el('p', { class: 'note stacks-reason' }, r));
    for (const n of stacks.notes || []) card.appendChild(el('p', { class: 'muted' }, n));
    if ((stacks.processes || []).length) {
      card.appendChild(el('p', { class: 'muted legend-line' }, 'frames innermost first: = the same in both dumps · ~ moved · · native (second dump)'));
    }
    for (const p of stacks.processes || []) card.appendChild(process(p));
    if ((stacks.gpus || []).length) card.append(el('h3', {}, 'GPUs at the dumps'), gpuTable(stacks.gpus));
    const env = Object.entries(stacks.env || {});
    if (env.length) card.appendChild(el('details', { id: 'stacks-env' }, el('summary', {}, 'NCCL / CUDA / vLLM environment (' + env.length + ' variables)'),
      el('pre', { class: 'log' }, env.map(([k, v]) => k + '=' + v).join('\n'))));
  }

  return { render, frameText };
})();

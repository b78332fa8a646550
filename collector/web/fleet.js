// The fleet page: crashes grouped by signature (where they fell: one GPU, or many) and the
// incidents across nodes, with the filters in the query string.
'use strict';
(function () {
  const { api, el, showError, isoTime } = FR;
  const NAMES = ['host', 'engine', 'model', 'vllm_version', 'xid', 'fault_class'];
  const params = new URLSearchParams(location.search);
  const form = document.getElementById('filters');
  const status = document.getElementById('status');
  const groups = document.querySelector('#groups tbody');
  const incidents = document.querySelector('#incidents tbody');

  function query() {
    const q = new URLSearchParams({ limit: '100' });
    for (const name of NAMES) if (params.get(name)) q.set(name, params.get(name));
    return q;
  }

  function snapshotLinks(ids) {
    const td = el('td', { class: 'l' });
    ids.forEach((id, i) => {
      if (i) td.appendChild(document.createTextNode(' '));
      td.appendChild(el('a', { href: '/snapshots/' + encodeURIComponent(id) }, '#' + id));
    });
    return td;
  }

  async function facets() {
    const f = await api('/api/v1/fleet/facets');
    for (const name of ['host', 'engine', 'model', 'vllm_version', 'xid']) {
      const select = form.elements[name];
      for (const v of f[name] || []) select.appendChild(el('option', { value: v }, v));
    }
    for (const name of NAMES) if (params.get(name)) form.elements[name].value = params.get(name);
  }

  async function load() {
    const [crashes, incs] = (await Promise.all([api('/api/v1/fleet/crashes?' + query()), api('/api/v1/fleet/incidents?' + query())])).map((page) => page.items);
    for (const g of crashes) {
      const d = g.detail || {};
      groups.appendChild(el('tr', { class: 'group', 'data-pattern': g.pattern },
        el('td', { class: 'l mono' }, g.signature || '(none)'),
        el('td', { class: 'l' }, el('b', {}, g.suspect), ': ' + g.text),
        el('td', {}, g.occurrences === g.snapshots ? String(g.occurrences) : `${g.occurrences} (${g.snapshots} snapshots)`),
        el('td', { class: 'l' }, g.hosts.join(', ')),
        el('td', { class: 'l' }, g.gpus.map((x) => x.host + '/' + x.gpu).join(', ')),
        el('td', {}, g.xid ?? ''),
        el('td', { class: 'l' }, d.cuda_error || ''),
        el('td', { class: 'l mono' }, (d.frames || []).map((f) => f.split(' < ')[0]).join('; ')),
        el('td', { class: 'l' }, g.model || ''),
        el('td', { class: 'l' }, g.vllm_version || ''),
        el('td', { class: 'l' }, isoTime(g.last_fault)),
        snapshotLinks(g.items.map((s) => s.id))));
    }
    for (const i of incs) {
      incidents.appendChild(el('tr', {},
        el('td', {}, i.id), el('td', { class: 'l' }, isoTime(i.opened_at)), el('td', { class: 'l' }, (i.hosts || []).join(', ')),
        el('td', { class: 'l' }, i.gpus.join(', ')), el('td', { class: 'l mono' }, i.signatures.join(', ')),
        snapshotLinks(i.snapshot_ids), el('td', { class: 'l' }, (i.title || '').slice(0, 160))));
    }
    status.textContent = crashes.length + ' signature(s), ' + incs.length + ' incident(s)';
  }

  (async () => {
    try {
      await facets();
      await load();
    } catch (err) {
      showError(status, err);
    }
  })();
})();

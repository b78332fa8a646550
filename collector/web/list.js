// The snapshot list: newest first, filters from the query string, cursor pagination.
'use strict';
(function () {
  const { api, el, showError, isoTime, fmt } = FR;
  const params = new URLSearchParams(location.search);
  const form = document.getElementById('filters');
  for (const name of ['engine', 'host', 'trigger', 'incident_id']) if (params.get(name)) form.elements[name].value = params.get(name);
  const status = document.getElementById('status');
  const tbody = document.querySelector('#list tbody');
  const more = document.getElementById('more');
  let cursor = null;
  async function load() {
    const q = new URLSearchParams({ limit: '100' });
    for (const name of ['engine', 'host', 'trigger', 'incident_id']) if (params.get(name)) q.set(name, params.get(name));
    if (cursor) q.set('cursor', cursor);
    try {
      const page = await api('/api/v1/snapshots?' + q);
      for (const s of page.items) {
        const sum = s.summary || {};
        tbody.appendChild(el('tr', {},
          el('td', {}, el('a', { href: '/snapshots/' + encodeURIComponent(s.id) }, s.id)),
          el('td', { class: 'l' }, isoTime(s.created_at)), el('td', { class: 'l' }, s.host), el('td', { class: 'l' }, s.engine),
          el('td', { class: 'l' }, s.trigger_kind), el('td', {}, s.incident_id ? el('a', { href: '/incidents/' + encodeURIComponent(s.incident_id) }, s.incident_id) : ''), el('td', {}, s.step_count),
          el('td', {}, s.request_rows), el('td', {}, fmt(sum.running)), el('td', {}, fmt(sum.kv_cache_usage)),
          el('td', { class: 'l' }, (s.trigger_message || '').slice(0, 120))));
      }
      cursor = page.next_cursor;
      more.hidden = !cursor;
      status.textContent = tbody.children.length + ' snapshot(s) shown' + (cursor ? '; more below' : '');
    } catch (err) {
      showError(status, err);
    }
  }
  more.addEventListener('click', load);
  load();
})();

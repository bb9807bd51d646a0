// The web UI's script: it fills the server's pages from the REST API.
// Everything from the server is put in the page as text, never as HTML.
'use strict';

const csrf = document.querySelector('meta[name="csrf-token"]')?.content || '';

/** Calls the REST API; throws an Error with the server's message on failure.
 * A rate refusal that says to retry within a few seconds is waited out and
 * sent again (twice at most): the page's own refreshes may have used a small
 * tier's burst just before a person's click. */
async function api(method, path, body, raw) {
  for (let tries = 0; ; tries += 1) {
    try {
      return await apiOnce(method, path, body, raw);
    } catch (e) {
      if (!(e.retryAfter <= 5) || tries === 2) throw e;
      await new Promise((done) => { setTimeout(done, e.retryAfter * 1000); });
    }
  }
}

async function apiOnce(method, path, body, raw) {
  const headers = { 'X-CSRF-Token': csrf, Accept: 'application/json' };
  let payload;
  if (raw !== undefined) {
    payload = raw;
    headers['Content-Type'] = 'application/octet-stream';
  } else if (body !== undefined) {
    payload = JSON.stringify(body);
    headers['Content-Type'] = 'application/json';
  }
  const response = await fetch(path, { method, headers, body: payload, credentials: 'same-origin' });
  const text = await response.text();
  let data;
  try { data = JSON.parse(text); } catch { data = { error: text || response.statusText }; }
  if (!response.ok) {
    const error = new Error(data.error || `${response.status} ${response.statusText}`);
    if (response.status === 429) error.retryAfter = Number(response.headers.get('Retry-After') || NaN);
    throw error;
  }
  return data;
}

/** An element with attributes and children (strings become text). */
function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (v === undefined || v === null || v === false) continue;
    if (k.startsWith('on')) node.addEventListener(k.slice(2), v);
    else node.setAttribute(k, v === true ? '' : v);
  }
  for (const c of children) node.append(c instanceof Node ? c : document.createTextNode(String(c ?? '')));
  return node;
}

/** Artifact links name the server's public URL; the UI loads them from its own origin. */
function local(url) {
  const u = new URL(url, location.href);
  return u.pathname + u.search;
}

function showError(e) {
  const box = document.getElementById('error');
  if (!box) return;
  box.textContent = e ? String(e.message || e) : '';
  box.hidden = !e;
}

function age(iso) {
  const s = Math.max(0, (Date.now() - Date.parse(iso)) / 1000);
  if (s < 60) return `${Math.round(s)} s`;
  if (s < 3600) return `${Math.round(s / 60)} min`;
  if (s < 86400) return `${(s / 3600).toFixed(1)} h`;
  return `${(s / 86400).toFixed(1)} d`;
}

function when(iso) { return iso ? new Date(iso).toLocaleString() : 'never'; }
function bytes(n) {
  if (n == null) return '—';
  const units = ['B', 'KiB', 'MiB', 'GiB'];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) { n /= 1024; i++; }
  return `${i ? n.toFixed(1) : n} ${units[i]}`;
}
function cpu(usage) { return usage ? `${usage.cpu_seconds.toFixed(2)} s` : '—'; }
function memory(usage) { return usage ? bytes(usage.memory_bytes) : '—'; }
/** Disk use against the quota of each capped folder ("full" at the cap). */
function disk(d) {
  if (!d) return '—';
  const part = (label, q) => q && `${label} ${q.used_mb}/${q.quota_mb} MB${q.full ? ' (full)' : ''}`;
  return [part('results', d.results), part('packages', d.packages)].filter(Boolean).join(', ') || '—';
}
function status(s) { return el('span', { class: `status ${s}` }, s); }

/** Runs `work` with the form's buttons disabled, showing any error. */
async function busy(form, work) {
  const buttons = form.querySelectorAll('button');
  buttons.forEach((b) => { b.disabled = true; });
  try { showError(null); await work(); } catch (e) { showError(e); } finally {
    buttons.forEach((b) => { b.disabled = false; });
  }
}

// ---- the list of sandboxes ----

async function loadList() {
  const table = document.getElementById('sandboxes');
  const data = await api('GET', '/api/sandboxes');
  const body = table.tBodies[0];
  body.replaceChildren(...data.sandboxes.map((s) => {
    const open = `/ui/sandboxes/${encodeURIComponent(s.sandbox_id)}`;
    const act = (label, cls, method, path) => el('button', {
      class: cls,
      'data-action': label.toLowerCase(),
      onclick: async (ev) => {
        ev.target.disabled = true;
        try { showError(null); await api(method, path); } catch (e) { showError(e); }
        await loadList();
      },
    }, label);
    return el('tr', { 'data-id': s.sandbox_id },
      el('td', {}, el('a', { href: open, class: 'name' }, s.name)),
      el('td', { class: 'mono' }, s.sandbox_id.slice(0, 8)),
      ...(data.admin ? [el('td', { class: 'owner' }, s.owner ?? '')] : []),
      el('td', {}, status(s.status)),
      el('td', {}, age(s.created_at)),
      el('td', {}, when(s.expires_at)),
      el('td', {}, cpu(s.usage)),
      el('td', {}, memory(s.usage)),
      el('td', { class: 'disk' }, disk(s.disk)),
      el('td', {}, String(s.installed_packages.length)),
      el('td', { class: 'actions' },
        act('Restart', 'secondary', 'POST', `/api/sandboxes/${s.sandbox_id}/restart`),
        act('Delete', 'danger', 'DELETE', `/api/sandboxes/${s.sandbox_id}`)));
  }));
  document.getElementById('empty').hidden = data.sandboxes.length > 0;
  table.dataset.loaded = 'true';
}

// The templates the key may use, as choices of the create form (hidden
// when there are none).
async function loadTemplates() {
  const select = document.getElementById('create-template');
  const { templates } = await api('GET', '/api/templates');
  const usable = templates.filter((t) => t.available);
  select.append(...usable.map((t) => el('option', { value: t.name, title: t.description }, t.name)));
  select.hidden = usable.length === 0;
}

function listPage() {
  const form = document.getElementById('create-form');
  form.addEventListener('submit', (ev) => {
    ev.preventDefault();
    busy(form, async () => {
      const name = form.elements.name.value.trim();
      const template = form.elements.template.value;
      await api('POST', '/api/sandboxes', { ...(name ? { name } : {}), ...(template ? { template } : {}) });
      form.reset();
      await loadList();
    });
  });
  loadTemplates().catch(showError);
  loadList().catch(showError);
  setInterval(() => loadList().catch(showError), 5000);
}

// ---- one sandbox ----

function sandboxPage(root) {
  const id = root.dataset.id;
  const base = `/api/sandboxes/${id}`;

  async function loadInfo() {
    const s = await api('GET', base);
    document.getElementById('sandbox-name').textContent = s.name;
    document.title = `${s.name} · mcp-sandbox`;
    const rows = [
      ['ID', el('code', {}, s.sandbox_id)],
      ['Status', status(s.status)],
      ['Created', `${when(s.created_at)} (${age(s.created_at)} ago)`],
      ['Expires', when(s.expires_at)],
      ['CPU time', cpu(s.usage)],
      ['Memory', memory(s.usage)],
      ['Disk', disk(s.disk)],
      ['Template', s.template ?? 'default'],
      ['Packages', s.installed_packages.map((p) => `${p.name} ${p.version}`).join(', ') || 'none'],
    ];
    if (s.owner) rows.splice(1, 0, ['Owner', s.owner]);
    document.getElementById('info').replaceChildren(...rows.flatMap(([k, v]) => [el('dt', {}, k), el('dd', {}, v)]));
    document.getElementById('history').tBodies[0].replaceChildren(...s.history.slice().reverse().map((c) =>
      el('tr', { class: c.ok ? '' : 'failed' },
        el('td', {}, new Date(c.started_at).toLocaleTimeString()),
        el('td', {}, c.kind),
        el('td', { class: 'mono' }, c.summary),
        el('td', { class: c.ok ? 'ok' : 'error' }, c.outcome),
        el('td', {}, String(c.duration_ms)))));
    root.dataset.status = s.status;
    showPorts(s.exposed_ports);
    return s;
  }

  async function loadFiles() {
    const data = await api('GET', `${base}/files`);
    const images = /\.(png|jpe?g|gif|webp|svg)$/i;
    document.getElementById('files').tBodies[0].replaceChildren(...data.files.map((f) => el('tr', { 'data-path': f.path },
      el('td', {}, el('a', { href: local(f.url), target: '_blank', rel: 'noopener' }, f.path)),
      el('td', {}, bytes(f.size)),
      el('td', {}, new Date(f.modified * 1000).toLocaleString()),
      el('td', {}, images.test(f.path) ? el('img', { class: 'preview', src: local(f.url), alt: f.path }) : ''))));
  }

  async function loadSnapshots() {
    const data = await api('GET', `${base}/snapshots`);
    const act = (label, cls, method, path, done) => el('button', {
      class: cls,
      'data-action': label.toLowerCase(),
      onclick: (ev) => busy(ev.target.parentElement, async () => {
        const r = await api(method, path);
        if (done) done(r);
        await refresh();
      }),
    }, label);
    const said = (text) => { document.getElementById('snapshot-status').textContent = text; };
    document.getElementById('snapshots').tBodies[0].replaceChildren(...data.snapshots.map((s) => {
      const path = `${base}/snapshots/${s.snapshot_id}`;
      return el('tr', { 'data-id': s.snapshot_id },
        el('td', {}, s.label ?? ''),
        el('td', {}, `${when(s.created_at)} (${age(s.created_at)} ago)`),
        el('td', {}, s.python),
        el('td', {}, String(s.files)),
        el('td', {}, bytes(s.disk_bytes)),
        el('td', { class: 'actions' },
          act('Restore', 'secondary', 'POST', `${path}/restore`, (r) => said(`restored: Python ${r.python}${r.notice ? ` (${r.notice})` : ''}`)),
          el('button', {
            class: 'secondary',
            'data-action': 'fork',
            onclick: (ev) => busy(ev.target.parentElement, () => fork({ snapshot_id: s.snapshot_id })),
          }, 'Fork'),
          act('Delete', 'danger', 'DELETE', path, () => said('snapshot deleted'))));
    }));
  }

  /** Makes a fork (of the sandbox, or of one of its snapshots) and links to it. */
  async function fork(body) {
    const r = await api('POST', `${base}/forks`, body);
    const [f] = r.forks;
    document.getElementById('snapshot-status').replaceChildren(
      'forked: ', el('a', { href: `/ui/sandboxes/${encodeURIComponent(f.sandbox_id)}`, id: 'fork-link' }, f.name),
      ` (Python ${f.python}${f.not_carried.length ? `; not carried: ${f.not_carried.map((n) => n.name).join(', ')}` : ''})`);
  }

  /** Which process the output pane follows; a newer choice ends an older follow. */
  let following = 0;

  /**
   * Shows a process's output and, while it runs, follows it for a while with
   * waiting reads: a slow starter's first lines still appear without a click.
   */
  async function showOutput(path, first, text) {
    const shown = document.getElementById('process-output');
    const mine = ++following;
    shown.hidden = false;
    shown.textContent = text;
    let out = first;
    for (let turn = 0; turn < 10 && out.process.state === 'running' && mine === following; turn++) {
      try {
        out = await api('GET', `${path}/output?offset=${out.next_offset}&wait_seconds=3&max_bytes=65536`);
      } catch (_) {
        return;
      }
      if (mine !== following) return;
      shown.textContent += out.output;
    }
  }

  /** The sandbox's background processes: output on request, a stop each. */
  async function loadProcesses() {
    const data = await api('GET', `${base}/processes`);
    document.getElementById('processes').tBodies[0].replaceChildren(...data.processes.slice().reverse().map((p) => {
      const path = `${base}/processes/${p.process_id}`;
      const state = p.state === 'exited' ? `exited${p.exit_code === undefined ? '' : ` (${p.exit_code})`}` : p.state;
      return el('tr', { 'data-id': p.process_id },
        el('td', {}, el('code', {}, p.name || p.process_id)),
        el('td', { class: 'mono' }, p.command),
        el('td', { class: p.state === 'running' ? 'ok' : '', title: p.note || '' }, state),
        el('td', {}, bytes(p.output_bytes)),
        el('td', { class: 'actions' },
          el('button', {
            class: 'secondary',
            'data-action': 'output',
            onclick: (ev) => busy(ev.target.parentElement, async () => {
              const out = await api('GET', `${path}/output?offset=0&max_bytes=65536`);
              showOutput(path, out, (out.skipped ? `[${out.skipped} earlier bytes no longer kept]\n` : '') + out.output);
            }),
          }, 'Output'),
          p.state === 'running' ? el('button', {
            class: 'danger',
            'data-action': 'stop',
            onclick: (ev) => busy(ev.target.parentElement, async () => { await api('POST', `${path}/stop`); await refresh(); }),
          }, 'Stop') : ''));
    }));
  }

  /** The exposed ports, each opened through a fresh link. */
  function showPorts(ports) {
    document.getElementById('ports').replaceChildren(...(ports || []).map((port) => el('li', { 'data-port': String(port) },
      `port ${port} `,
      el('button', {
        class: 'secondary',
        'data-action': 'open',
        onclick: (ev) => busy(ev.target.parentElement, async () => {
          const r = await api('POST', `${base}/ports/${port}`);
          window.open(r.url, '_blank', 'noopener');
        }),
      }, 'Open'),
      el('button', {
        class: 'danger',
        'data-action': 'unexpose',
        onclick: (ev) => busy(ev.target.parentElement, async () => { await api('DELETE', `${base}/ports/${port}`); await refresh(); }),
      }, 'Unexpose'))));
  }

  /**
   * The page again. The files, snapshots and processes of a sleeping
   * sandbox are read only when asked (reading them wakes it).
   */
  const refresh = () => loadInfo()
    .then((s) => {
      const asleep = s.status === 'hibernated';
      document.getElementById('asleep').hidden = !asleep;
      return Promise.all(asleep ? [] : [loadFiles(), loadSnapshots(), loadProcesses()]);
    })
    .catch(showError);

  const processForm = document.getElementById('process-form');
  processForm.addEventListener('submit', (ev) => {
    ev.preventDefault();
    busy(processForm, async () => {
      const r = await api('POST', `${base}/processes`, { command: processForm.elements.command.value });
      processForm.reset();
      showOutput(`${base}/processes/${r.process.process_id}`, r, r.output);
      await refresh();
    });
  });
  const exposeForm = document.getElementById('expose-form');
  exposeForm.addEventListener('submit', (ev) => {
    ev.preventDefault();
    busy(exposeForm, async () => {
      await api('POST', `${base}/ports/${Number(exposeForm.elements.port.value)}`);
      exposeForm.reset();
      await refresh();
    });
  });

  function showRun(prefix, r) {
    document.getElementById(`${prefix}-out`).hidden = false;
    document.getElementById(`${prefix}-exit`).textContent = r.timed_out ? `${r.exit_code} (timed out)` : String(r.exit_code);
    document.getElementById(`${prefix}-stdout`).textContent = r.stdout;
    document.getElementById(`${prefix}-stderr`).textContent = (r.notice ? `[notice] ${r.notice}\n` : '') + r.stderr;
    const duration = document.getElementById(`${prefix}-duration`);
    if (duration) duration.textContent = r.duration_ms.toFixed(1);
    document.getElementById(`${prefix}-outputs`).replaceChildren(...runOutputs(r));
  }

  /** What a run showed, in order (values, display(), figures), then the
   * images among its files: text as text (HTML too: it is the sandbox's),
   * images from their links. */
  function runOutputs(r) {
    const picture = (link, path) => el('a', { href: link, target: '_blank', rel: 'noopener' },
      el('img', { class: 'shown', src: local(link), alt: path }));
    const shown = (r.outputs || []).map((o) => (o.type === 'image'
      ? picture(o.link, o.path)
      : el('pre', { class: `shown ${o.type}` }, o.text)));
    const images = (r.files || []).map((path, i) => [path, r.file_links[i]])
      .filter(([path, link]) => link && /\.(png|jpe?g|gif|webp|svg)$/i.test(path))
      .slice(0, 3)
      .map(([path, link]) => picture(link, path));
    return [...shown, ...images];
  }

  /** Submits the run form `prefix`-form: its field `key` goes to the API, the result to `prefix`-out. */
  function runForm(prefix, key) {
    const form = document.getElementById(`${prefix}-form`);
    form.addEventListener('submit', (ev) => {
      ev.preventDefault();
      busy(form, async () => {
        showRun(prefix, await api('POST', `${base}/${prefix}`, { [key]: form.elements[key].value }));
        await refresh();
      });
    });
  }
  runForm('python', 'code');
  runForm('shell', 'command');

  const install = document.getElementById('install-form');
  function showInstall(r) {
    document.getElementById('install-status').textContent = r.status;
    document.getElementById('install-message').textContent = r.message;
    const out = document.getElementById('install-output');
    out.textContent = r.output || '';
    out.hidden = !r.output;
  }
  install.addEventListener('submit', (ev) => {
    ev.preventDefault();
    busy(install, async () => {
      const name = install.elements.package.value.trim();
      let r = await api('POST', `${base}/packages`, { package_name: name });
      showInstall(r);
      while (r.status === 'installing') {
        await new Promise((done) => { setTimeout(done, 1000); });
        r = await api('GET', `${base}/packages?package_name=${encodeURIComponent(name)}`);
        showInstall(r);
      }
      await refresh();
    });
  });

  const upload = document.getElementById('upload-form');
  upload.addEventListener('submit', (ev) => {
    ev.preventDefault();
    busy(upload, async () => {
      const file = upload.elements.file.files[0];
      if (!file) throw new Error('choose a file first');
      const r = await api('POST', `${base}/files?name=${encodeURIComponent(file.name)}`, undefined, file);
      document.getElementById('upload-status').textContent = `uploaded to ${r.path}`;
      upload.reset();
      await refresh();
    });
  });

  document.getElementById('fork').addEventListener('click', (ev) => {
    busy(ev.target.parentElement, () => fork({}));
  });

  const snapshot = document.getElementById('snapshot-form');
  snapshot.addEventListener('submit', (ev) => {
    ev.preventDefault();
    busy(snapshot, async () => {
      const label = snapshot.elements.label.value.trim();
      const r = await api('POST', `${base}/snapshots`, label ? { label } : {});
      document.getElementById('snapshot-status').textContent = `saved in ${r.duration_ms.toFixed(0)} ms`;
      snapshot.reset();
      await refresh();
    });
  });

  document.getElementById('restart').addEventListener('click', (ev) => {
    busy(ev.target.parentElement, async () => { await api('POST', `${base}/restart`); await refresh(); });
  });
  document.getElementById('hibernate').addEventListener('click', (ev) => {
    busy(ev.target.parentElement, async () => { await api('POST', `${base}/hibernate`); await refresh(); });
  });
  document.getElementById('wake').addEventListener('click', (ev) => {
    busy(ev.target.parentElement, async () => { await loadFiles(); await refresh(); });
  });
  document.getElementById('delete').addEventListener('click', (ev) => {
    busy(ev.target.parentElement, async () => { await api('DELETE', base); location.assign('/ui'); });
  });

  refresh();
}

// ---- usage ----

// Each measure: its title, its value in a row, and the digits it shows
// (a count shows none).
const MEASURES = [
  ['Sandbox hours', (r) => (r.running_seconds + r.paused_seconds) / 3600, 2],
  ['CPU hours', (r) => r.cpu_seconds / 3600, 4],
  ['Memory GB·h', (r) => r.memory_gb_seconds / 3600, 4],
  ['Network MiB', (r) => r.egress_bytes / 1048576, 2],
  ['Disk GB·h', (r) => r.disk_gb_hours, 4],
  ['Calls', (r) => r.calls, 0],
];

/** The days of this month (UTC) up to today, as `YYYY-MM-DD`: every day has
 * its place in a chart, so one day of data is one bar among the month's. */
function monthDays() {
  const now = new Date();
  return Array.from({ length: now.getUTCDate() }, (_, i) =>
    new Date(Date.UTC(now.getUTCFullYear(), now.getUTCMonth(), i + 1)).toISOString().slice(0, 10));
}

/** One bar per day of the month so far, as high as its share of the
 * busiest day. */
function chart(title, byDay, value, digits) {
  const days = [...new Set([...monthDays(), ...byDay.keys()])].sort();
  const totals = days.map((day) => [day, (byDay.get(day) || []).reduce((sum, r) => sum + value(r), 0)]);
  const top = Math.max(...totals.map(([, v]) => v), 0);
  const bars = totals.map(([day, v]) => {
    const bar = el('div', { class: 'bar', title: `${day}: ${v.toFixed(digits)}`, 'data-day': day });
    bar.style.height = `${top > 0 && v > 0 ? Math.max(1, (100 * v) / top) : 0}%`;
    return bar;
  });
  return el('figure', { class: 'chart', 'data-measure': title },
    el('figcaption', {}, `${title}: ${totals.reduce((s, [, v]) => s + v, 0).toFixed(digits)}`),
    el('div', { class: 'bars' }, ...bars));
}

async function usagePage() {
  const report = await api('GET', '/api/usage');
  const byDay = new Map();
  for (const r of report.rows) {
    const day = r.period.slice(0, 10);
    if (!byDay.has(day)) byDay.set(day, []);
    byDay.get(day).push(r);
  }
  document.getElementById('usage-charts').replaceChildren(...MEASURES.map(([t, f, d]) => chart(t, byDay, f, d)));
  const n = (v, digits) => v.toFixed(digits);
  document.getElementById('usage').tBodies[0].replaceChildren(...report.rows.map((r) => el('tr', { 'data-tenant': r.tenant },
    el('td', {}, r.period.slice(0, 10)),
    el('td', { class: 'owner' }, r.tenant),
    el('td', {}, n(MEASURES[0][1](r), 2)),
    el('td', { class: 'cpu' }, n(MEASURES[1][1](r), 4)),
    el('td', {}, n(MEASURES[2][1](r), 4)),
    el('td', {}, n(MEASURES[4][1](r), 4)),
    el('td', {}, n(MEASURES[3][1](r), 2)),
    el('td', {}, String(r.calls)),
    el('td', {}, String(r.installs)))));
  document.getElementById('usage-empty').hidden = report.rows.length > 0;
  document.getElementById('usage').dataset.loaded = 'true';
}

function usageDownload() {
  document.getElementById('usage-csv').addEventListener('click', async () => {
    try {
      const response = await fetch('/api/usage', { headers: { Accept: 'text/csv' }, credentials: 'same-origin' });
      if (!response.ok) throw new Error(`${response.status} ${response.statusText}`);
      const link = el('a', { href: URL.createObjectURL(await response.blob()), download: 'usage.csv' });
      link.click();
      URL.revokeObjectURL(link.href);
    } catch (e) { showError(e); }
  });
}

document.addEventListener('DOMContentLoaded', () => {
  if (document.getElementById('sandboxes')) listPage();
  if (document.getElementById('usage-page')) {
    usageDownload();
    usagePage().catch(showError);
  }
  const one = document.getElementById('sandbox');
  if (one) sandboxPage(one);
});

"""The viewer page's stylesheet and script (vanilla JS, no library), inlined by `view_page.render`.

The script reads one JSON object (``<script id="view-data">``) and draws from it; it fetches
nothing. Keys: Left/Right move along a row of tokens, Up/Down to the row above or below (the other
model, the next story), Home/End to a row's ends, ``[`` and ``]`` change the layer of the focused
row's model; Tab reaches each row once (a roving tabindex).
"""

CSS = """
body{font-family:-apple-system,'Segoe UI',Helvetica,Arial,sans-serif;margin:0;color:#222;line-height:1.4}
header{padding:12px 20px;border-bottom:1px solid #ddd;background:#fafafa}
h1{font-size:1.3em;margin:0 0 4px}h2{font-size:1.05em;margin:18px 0 6px}
#wrap{display:flex;align-items:flex-start}#main{flex:1;padding:0 20px 40px;min-width:0}
#inspector{position:sticky;top:0;width:330px;flex:none;height:100vh;overflow:auto;border-left:1px solid #ddd;
padding:10px 14px;background:#fcfcfc;font-size:.9em;box-sizing:border-box}
.legend{display:flex;flex-wrap:wrap;gap:14px;align-items:center;font-size:.85em;margin:6px 0}
.ramp{display:inline-block;width:220px;height:14px;border:1px solid #999;vertical-align:middle}
.sw{display:inline-block;min-width:14px;height:14px;border:1px solid #999;vertical-align:middle;margin-right:3px;
padding:0 3px;font-size:.8em;text-align:center}
.controls label{margin-right:18px;font-size:.9em}.controls input{vertical-align:middle}
.row{display:flex;align-items:flex-start;margin:3px 0}.rowlabel{width:120px;flex:none;font-size:.8em;color:#555;
padding-top:3px}.toks{display:flex;flex-wrap:wrap;gap:2px 1px}
.tok{font-family:Menlo,Consolas,monospace;font-size:.82em;padding:1px 3px 0;border-bottom:4px solid transparent;
cursor:default;border-radius:2px}
.tok:focus,.tok.sel{outline:2px solid #000;outline-offset:1px}.tok.bnd{box-shadow:inset -2px 0 0 #000}
.tok.thought::after{content:'\\2022';color:#6a3d9a;font-size:.9em;vertical-align:super}
dl{display:grid;grid-template-columns:auto 1fr;gap:2px 8px;margin:6px 0}dt{color:#666}dd{margin:0}
table.layers{border-collapse:collapse;width:100%;font-size:.85em}table.layers td,table.layers th{padding:1px 4px;
text-align:left}table.layers tr.cur{background:#eee}.barbox{width:120px;height:10px;background:#eee;position:relative}
.bar{height:10px;display:inline-block}.num{font-family:Menlo,Consolas,monospace;text-align:right}
.step{font-size:.82em;margin:2px 0 2px 120px}.chip{font-family:Menlo,Consolas,monospace;padding:0 3px;margin:0 1px;
border-radius:2px}.chip.rej{text-decoration:line-through}.muted{color:#777}
"""

JS = r"""
(function () {
  'use strict';
  const D = JSON.parse(document.getElementById('view-data').textContent);
  const S = D.state_names, K = S.length, binary = K === 2;
  const layer = {};  // model name -> row of its probe shown
  D.models.forEach(m => { layer[m.name] = m.best; });
  const el = (tag, attrs, text) => {
    const e = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
    if (text !== undefined) e.textContent = text;
    return e;
  };
  const hex = h => [1, 3, 5].map(i => parseInt(h.slice(i, i + 2), 16));
  function ramp(stops, x) {  // linear interpolation between evenly spaced stops, x in [0, 1]
    const f = Math.min(Math.max(x, 0), 1) * (stops.length - 1), i = Math.min(Math.floor(f), stops.length - 2);
    const a = hex(stops[i]), b = hex(stops[i + 1]), t = f - i;
    return 'rgb(' + a.map((v, j) => Math.round(v + (b[j] - v) * t)).join(',') + ')';
  }
  const argmax = a => a.reduce((best, v, i) => v > a[best] ? i : best, 0);
  const rgb = c => c.startsWith('#') ? hex(c) : c.match(/\d+/g).map(Number);
  const dark = c => { const [r, g, b] = rgb(c); return 0.299 * r + 0.587 * g + 0.114 * b < 140; };
  function colour(dist) {  // binary: the diverging map on P(first state); n-way: the argmax state's colour
    if (binary) return ramp(D.belief_colours, dist[0]);
    const k = argmax(dist), [r, g, b] = hex(D.state_colours[k]), a = 0.25 + 0.75 * dist[k];
    return 'rgb(' + [r, g, b].map(v => Math.round(255 - (255 - v) * a)).join(',') + ')';
  }
  const truthColour = k => binary ? D.belief_colours[k === 0 ? D.belief_colours.length - 1 : 0] : D.state_colours[k];
  const layerName = (m, r) => m.layers[r] < 0 ? 'embedding' : 'L' + m.layers[r];
  const fmt = x => x.toFixed(3);
  const pname = k => D.provenance[String(k)].name;

  // ------------------------------------------------------------------ header: legend and layer controls
  const legend = document.getElementById('legend');
  if (binary) {
    const r = el('span', {class: 'ramp', id: 'ramp'});
    r.style.background = 'linear-gradient(to right,' + D.belief_colours.join(',') + ')';
    legend.append(el('span', {}, 'P(' + S[0] + ') = 0 (' + S[1] + ')'), r, el('span', {}, '1 (' + S[0] + ')'));
  } else {
    const box = el('span', {id: 'states'}, 'probe state (paler = less sure): ');
    S.forEach((s, k) => { const w = el('span', {class: 'sw', 'data-state': s}, s);
      w.style.background = D.state_colours[k]; w.style.color = dark(D.state_colours[k]) ? '#fff' : '#000';
      box.append(w); });
    legend.append(box);
  }
  legend.append(el('span', {}, 'underline: the truth · right edge: an event boundary · \u2022: a thought'));
  const controls = document.getElementById('controls');
  D.models.forEach((m, mi) => {
    const lab = el('label', {}, m.name + ' layer ');
    const inp = el('input', {type: 'range', min: 0, max: m.layers.length - 1, step: 1, value: m.best,
                             id: 'layer-' + mi, 'aria-label': m.name + ' probe layer'});
    const out = el('output', {id: 'layer-name-' + mi}, layerName(m, m.best));
    inp.addEventListener('input', () => setLayer(mi, Number(inp.value)));
    lab.append(inp, ' ', out);
    controls.append(lab);
  });

  // ------------------------------------------------------------------ stories: one row per model
  const main = document.getElementById('stories');
  const rows = [];  // every row of tokens, in page order (for Up/Down)
  D.stories.forEach((st, si) => {
    main.append(el('h2', {}, 'Story ' + (si + 1) + ': ' + st.n_events + ' events, answer ' + st.answer));
    D.models.forEach((m, mi) => {
      const P = st.models[m.name], row = el('div', {class: 'row', 'data-model': m.name});
      const toks = el('div', {class: 'toks'});
      const at = {}; P.boundaries.forEach((b, j) => { at[b] = j; });
      P.tokens.forEach((t, ti) => {
        const s = el('span', {class: 'tok', tabindex: ti === 0 ? 0 : -1, 'data-s': si, 'data-m': mi, 'data-t': ti}, t);
        s.style.borderBottomColor = truthColour(P.truth[ti]);
        if (ti in at) { s.classList.add('bnd'); if (P.thought && P.thought[at[ti]] >= 0) s.classList.add('thought'); }
        toks.append(s);
      });
      row.append(el('span', {class: 'rowlabel'}, m.name), toks);
      main.append(row);
      rows.push(toks);
    });
  });
  function paint(mi) {
    const m = D.models[mi], r = layer[m.name];
    document.querySelectorAll('.tok[data-m="' + mi + '"]').forEach(s => {
      const c = colour(D.stories[s.dataset.s].models[m.name].p[r][s.dataset.t]);
      s.style.background = c; s.style.color = dark(c) ? '#fff' : '#000';
    });
  }
  function setLayer(mi, r) {
    const m = D.models[mi];
    r = Math.min(Math.max(r, 0), m.layers.length - 1);
    layer[m.name] = r;
    document.getElementById('layer-' + mi).value = r;
    document.getElementById('layer-name-' + mi).textContent = layerName(m, r);
    paint(mi);
    if (current && current.dataset.m === String(mi)) show(current);
  }

  // ------------------------------------------------------------------ the inspector
  const ins = document.getElementById('inspector');
  let current = null;
  function iiaAt(m, P, ti, b) {  // the block's interchange accuracy at this token's position rule, if measured
    if (b < 0) return '';
    const j = P.boundaries.indexOf(ti), last = P.boundaries.length - 1;
    const rules = ti === P.tokens.length - 1 ? ['last'] : j < 0 ? [] :
      (j === last ? ['last_event', 'event:' + j, 'event:-1'] : ['event:' + j, 'event:' + (j - last - 1)]);
    const rule = rules.find(x => m.iia[x] && m.iia[x][b] !== null && m.iia[x][b] !== undefined);
    return rule ? 'IIA ' + fmt(m.iia[rule][b]) : '';
  }
  function dd(dl, key, id, text) { dl.append(el('dt', {}, key), el('dd', {id: id}, text)); }
  function show(s) {
    if (current) current.classList.remove('sel');
    current = s; s.classList.add('sel');
    ins.replaceChildren();
    if (s.dataset.d !== undefined) return showDecoded(s);
    const si = Number(s.dataset.s), mi = Number(s.dataset.m), ti = Number(s.dataset.t);
    const m = D.models[mi], P = D.stories[si].models[m.name], r = layer[m.name];
    ins.append(el('h2', {id: 'ins-title'}, m.name + ' \u00b7 story ' + (si + 1) + ' \u00b7 token ' + ti + ' \u201c' +
                       P.tokens[ti] + '\u201d'));
    const dl = el('dl');
    dd(dl, 'truth', 'ins-truth', S[P.truth[ti]]);
    const d = P.p[r][ti], k = argmax(d);
    dd(dl, 'probe at ' + layerName(m, r), 'ins-probe',
       binary ? 'P(' + S[0] + ') = ' + fmt(d[0]) : S[k] + ' ' + fmt(d[k]));
    const j = P.boundaries.indexOf(ti);
    if (!P.forced) { /* no --question: no forced answer was read */ }
    else if (j < 0) dd(dl, 'forced answer', 'ins-forced', '\u2014 (not an event boundary)');
    else { const f = P.forced[j], fk = argmax(f);
      dd(dl, 'forced answer', 'ins-forced', S[fk] + ' (P ' + fmt(f[fk]) + ')'); }
    if (m.thinking) dd(dl, 'thought', 'ins-thought', j < 0 ? '\u2014 (written after an event)' :
                       P.thought[j] >= 0 ? S[P.thought[j]] : '(none)');
    if (P.lens) dd(dl, 'logit lens', 'ins-lens', P.lens_from[ti] === null ?
                   'the model\u2019s answer is not readable here' :
                   S[P.lens[ti][P.lens[ti].length - 1]] + ' readable from block ' + P.lens_from[ti]);
    ins.append(dl, el('div', {class: 'muted'}, binary ? 'P(' + S[0] + ') at every layer:' :
                      'state the probe reads at every layer:'));
    const tab = el('table', {class: 'layers', id: 'ins-layers'});
    m.layers.forEach((_, lr) => {
      const v = P.p[lr][ti], tr = el('tr', {'data-layer': lr});
      if (lr === r) tr.classList.add('cur');
      const box = el('div', {class: 'barbox'});
      if (binary) { const b = el('span', {class: 'bar'}); b.style.width = (100 * v[0]) + '%';
        b.style.background = colour(v); box.append(b); }
      else v.forEach((x, kk) => { const b = el('span', {class: 'bar'}); b.style.width = (100 * x) + '%';
        b.style.background = D.state_colours[kk]; box.append(b); });
      const td = el('td'); td.append(box);
      const kk = argmax(v);
      const b = m.layers[lr];  // the block of this probe row (-1: the embedding, which the lens does not read)
      tr.append(el('th', {}, layerName(m, lr)), td);
      if (P.lens) tr.append(el('td', {class: 'lens'}, b >= 0 ? 'lens ' + S[P.lens[ti][b]] : ''));
      if (m.iia) tr.append(el('td', {class: 'iia'}, iiaAt(m, P, ti, b)));
      tr.append(el('td', {class: 'num'}, binary ? fmt(v[0]) : S[kk] + ' ' + fmt(v[kk])));
      tab.append(tr);
    });
    ins.append(tab, el('p', {class: 'muted'},
                       'probe: ' + (m.probe.fitted ? 'fitted ' + m.probe.fitted :
                                    m.probe.folder + ' (checkpoint ' + m.probe.checkpoint_hash + ')')));
  }

  // ------------------------------------------------------------------ the speculative-decoding trace
  function showDecoded(s) {
    const R = D.decode.stories[s.dataset.d], i = Number(s.dataset.t);
    ins.append(el('h2', {id: 'ins-title'}, D.decode.model + ' decoding \u00b7 story ' + (Number(s.dataset.d) + 1) +
                      ' \u00b7 position ' + i + ' \u201c' + R.tokens[i] + '\u201d'));
    const dl = el('dl');
    const prov = i < R.provenance.length ? pname(R.provenance[i]) : 'not cached (the last token)';
    dd(dl, 'KV cache', 'ins-provenance', prov);
    const k = R.step_of[i];
    if (k < 0) dd(dl, 'written by', 'ins-step',
                  i < R.prompt_len ? 'the prefill (the story)' : "the prefill's prediction");
    else {
      const st = R.steps[k];
      dd(dl, 'committed by', 'ins-step', 'verify step ' + k);
      dd(dl, 'drafted', 'ins-drafted', st.drafted.join(' ') || '\u2014');
      dd(dl, 'accepted', 'ins-accepted', String(st.accepted));
      dd(dl, 'rolled back', 'ins-rejected', st.rejected.join(' ') || '\u2014');
    }
    ins.append(dl);
  }
  const dec = document.getElementById('decode');
  if (D.decode) {
    dec.append(el('h2', {}, 'Speculative decoding: ' + D.decode.model + ' verifies ' + D.decode.drafter +
                  ', \u03b3 = ' + D.decode.gamma));
    const lg = el('div', {class: 'legend'});
    Object.values(D.provenance).forEach(p => { const w = el('span', {class: 'sw'}, p.name);
      w.style.background = p.colour; lg.append(w); });
    dec.append(lg);
    D.decode.stories.forEach((R, di) => {
      const row = el('div', {class: 'row', 'data-decode': di}), toks = el('div', {class: 'toks'});
      R.tokens.forEach((t, i) => {
        const s = el('span', {class: 'tok', tabindex: i === 0 ? 0 : -1, 'data-d': di, 'data-t': i}, t);
        const c = i < R.provenance.length ? D.provenance[String(R.provenance[i])].colour : '#ffffff';
        s.style.background = c;
        toks.append(s);
      });
      const acc = R.acceptance === null ? 'nothing drafted' : Math.round(100 * R.acceptance) + '% accepted';
      row.append(el('span', {class: 'rowlabel'}, 'story ' + (di + 1) + ' (' + acc + ')'), toks);
      dec.append(row);
      rows.push(toks);
      R.steps.forEach(st => {
        const p = el('div', {class: 'step', 'data-step': st.index}, 'step ' + st.index + ' @' + st.position + ': ');
        st.drafted.forEach((t, j) => {
          const ok = j < st.accepted, c = el('span', {class: 'chip ' + (ok ? 'acc' : 'rej')}, t);
          c.style.background = D.provenance[ok ? '4' : '3'].colour; p.append(c);
        });
        const ref = el('span', {class: 'chip ref'}, st.committed[st.committed.length - 1]);
        ref.style.outline = '1px solid ' + D.provenance['2'].colour;
        p.append(' \u2192 ', ref, el('span', {class: 'muted'},
                                     ' (' + st.accepted + ' of ' + st.drafted.length + ' accepted' +
                                     (st.rejected.length ? ', ' + st.rejected.length + ' rolled back)' : ')')));
        dec.append(p);
      });
    });
  }

  // ------------------------------------------------------------------ pointer and keyboard
  document.addEventListener('mouseover', e => { if (e.target.classList.contains('tok')) show(e.target); });
  document.addEventListener('focusin', e => { if (e.target.classList.contains('tok')) show(e.target); });
  function go(s) { if (!s) return; s.parentNode.querySelectorAll('.tok').forEach(x => x.tabIndex = -1);
    s.tabIndex = 0; s.focus(); }
  document.addEventListener('keydown', e => {
    const s = e.target;
    if (!s.classList || !s.classList.contains('tok')) return;
    const row = s.parentNode, ri = rows.indexOf(row), ti = Number(s.dataset.t);
    const at = (rw, t) => rw && rw.children[Math.min(t, rw.children.length - 1)];
    let next = null;
    if (e.key === 'ArrowRight') next = s.nextElementSibling;
    else if (e.key === 'ArrowLeft') next = s.previousElementSibling;
    else if (e.key === 'ArrowDown') next = at(rows[ri + 1], ti);
    else if (e.key === 'ArrowUp') next = at(rows[ri - 1], ti);
    else if (e.key === 'Home') next = row.firstElementChild;
    else if (e.key === 'End') next = row.lastElementChild;
    else if ((e.key === '[' || e.key === ']') && s.dataset.m !== undefined) {
      const mi = Number(s.dataset.m);
      setLayer(mi, layer[D.models[mi].name] + (e.key === ']' ? 1 : -1));
    } else return;
    e.preventDefault();
    go(next);
  });
  D.models.forEach((_, mi) => paint(mi));
  document.body.dataset.ready = '1';
})();
"""

// msprobe graph viewer: a virtualised, collapsible tree of one step/rank graph at a time.
// Only the rows in view exist in the DOM, so 20,000+ nodes stay responsive.
"use strict";
(function () {
  const t0 = performance.now();
  const ROW = 22, OVERSCAN = 10;
  const doc = JSON.parse(document.getElementById("graph-index").textContent);
  const VERDICTS = doc.verdicts;                 // ["none","pass","warning","error","unmatched"]
  const DIAG_BADGES = new Set(["introduces", "marginal"]);  // diagnosis labels worth a badge in the tree
  const V = {}; VERDICTS.forEach((v, i) => { V[v] = i; });
  const KIND_ICON = { module: "\u25A3", api: "\u0192", params_grad: "\u2207", scope: "\u25CB" };
  const $ = (id) => document.getElementById(id);
  const tree = $("tree"), spacer = $("spacer"), detail = $("detail"), search = $("search");

  let G = null;          // the current graph with derived arrays
  let visible = new Int32Array(0);
  let selected = -1;
  let matches = [], matchPos = -1, matchSet = null;
  const filters = new Set();
  const pool = [];

  // ---------- decoding (see packing.py) ----------
  async function unpack(id) {
    const bin = atob(document.getElementById(id).textContent.trim());
    const bytes = new Uint8Array(bin.length);
    for (let i = 0; i < bin.length; i++) bytes[i] = bin.charCodeAt(i);
    const stream = new Blob([bytes]).stream().pipeThrough(new DecompressionStream("gzip"));
    return JSON.parse(await new Response(stream).text());
  }

  function column(c) {
    if (c.v) return c.v;
    const out = new Array(c.c.length);
    for (let i = 0; i < c.c.length; i++) out[i] = c.d[c.c[i]];
    return out;
  }

  async function loadTree(g) {
    const t = await unpack("g" + g.index + "-tree");
    Object.assign(g, t);
    g.match = column(t.match).map((m, i) => (m === "" ? g.names[i] : m));
    g.diagnosis = t.diagnosis ? column(t.diagnosis) : g.names.map(() => "");
    return prepare(g);
  }

  async function loadDetail(g) {
    const d = await unpack("g" + g.index + "-detail");
    g.columns = d.columns;
    g.offsets = d.offsets;
    g.cells = d.cells.map(column);
    g.stack = d.stack;
    g.stacks = d.stacks;
    g.detailLoaded = true;
  }

  // The tensor rows of node i, with the names the packing shortened restored.
  function rowsOf(g, i) {
    if (!g.detailLoaded) return null;
    const npu = g.columns.indexOf("NPU Name"), bench = g.columns.indexOf("Bench Name");
    const rows = [];
    for (let r = g.offsets[i]; r < g.offsets[i + 1]; r++) {
      const row = g.cells.map((c) => c[r]);
      if (npu >= 0 && typeof row[npu] === "string" && row[npu].charAt(0) === ".") row[npu] = g.names[i] + row[npu];
      if (bench >= 0 && row[bench] === "=") row[bench] = row[npu];
      rows.push(row);
    }
    return rows;
  }

  // ---------- graph preparation ----------
  function prepare(g) {
    const n = g.names.length;
    const children = new Array(n), depth = new Int32Array(n);
    const inner = new Int32Array(n * 3);  // errors, warnings, unmatched strictly inside each subtree
    for (let i = 0; i < n; i++) children[i] = [];
    for (let i = 0; i < n; i++) {
      const p = g.parent[i];
      if (p >= 0) { children[p].push(i); depth[i] = depth[p] + 1; }
    }
    for (let i = n - 1; i >= 0; i--) {      // pre-order: children come after parents
      const p = g.parent[i];
      if (p < 0) continue;
      const v = g.verdict[i];
      inner[p * 3] += inner[i * 3] + (v === V.error ? 1 : 0);
      inner[p * 3 + 1] += inner[i * 3 + 1] + (v === V.warning ? 1 : 0);
      inner[p * 3 + 2] += inner[i * 3 + 2] + (v === V.unmatched ? 1 : 0);
    }
    const roots = [];
    for (let i = 0; i < n; i++) if (g.parent[i] < 0) roots.push(i);
    const lower = g.names.map((s) => s.toLowerCase());
    return Object.assign(g, { n, children, depth, inner, roots, lower,
      expanded: new Uint8Array(n), included: null });
  }

  // ---------- visible rows ----------
  function rebuild() {
    const out = [];
    const stack = [];
    for (let r = G.roots.length - 1; r >= 0; r--) stack.push(G.roots[r]);
    const inc = G.included;
    while (stack.length) {
      const i = stack.pop();
      if (inc && !inc[i]) continue;
      out.push(i);
      if (G.expanded[i]) {
        const c = G.children[i];
        for (let k = c.length - 1; k >= 0; k--) stack.push(c[k]);
      }
    }
    visible = Int32Array.from(out);
    spacer.style.height = (visible.length * ROW) + "px";
    render(true);
  }

  function hasVisibleChildren(i) {
    const c = G.children[i];
    if (!G.included) return c.length > 0;
    for (let k = 0; k < c.length; k++) if (G.included[c[k]]) return true;
    return false;
  }

  // ---------- rendering ----------
  function render() {
    const top = tree.scrollTop, h = tree.clientHeight || 600;
    const first = Math.max(0, Math.floor(top / ROW) - OVERSCAN);
    const last = Math.min(visible.length, Math.ceil((top + h) / ROW) + OVERSCAN);
    const need = last - first;
    while (pool.length < need) {
      const el = document.createElement("div");
      el.className = "row";
      el.innerHTML = '<span class="tw"></span><span class="kind"></span><span class="name"></span><span class="badges"></span>';
      spacer.appendChild(el);
      pool.push(el);
    }
    for (let k = 0; k < pool.length; k++) {
      const el = pool[k];
      if (k >= need) { el.style.display = "none"; el.dataset.index = ""; el.dataset.name = ""; continue; }
      const i = visible[first + k];
      el.style.display = "";
      el.style.top = ((first + k) * ROW) + "px";
      fillRow(el, i);
    }
  }

  function fillRow(el, i) {
    el.dataset.index = i;
    el.dataset.name = G.names[i];
    let cls = "row v-" + VERDICTS[G.verdict[i]];
    if (i === selected) cls += " selected";
    if (matchSet && matchSet.has(i)) cls += " match";
    if (G.side[i] === 1) cls += " golden-only";
    el.className = cls;
    el.style.paddingLeft = (4 + G.depth[i] * 14) + "px";
    const [tw, kind, name, badges] = el.children;
    tw.textContent = hasVisibleChildren(i) ? (G.expanded[i] ? "\u25BE" : "\u25B8") : "";
    kind.textContent = KIND_ICON[doc.kinds[G.kind[i]]] || "";
    kind.title = doc.kinds[G.kind[i]];
    name.textContent = G.names[i];
    let b = "";
    if (i === G.start_here) b += '<span class="badge start">start here</span>';
    if (G.overflow[i]) b += '<span class="badge ovf">overflow ' + doc.overflow_levels[G.overflow[i]] + "</span>";
    if (G.side[i] === 1) b += '<span class="badge gold">golden only</span>';
    if (DIAG_BADGES.has(G.diagnosis[i])) b += '<span class="badge diag d-' + G.diagnosis[i] + '">' + G.diagnosis[i] + "</span>";
    if (!G.expanded[i] && G.children[i].length) {
      const e = G.inner[i * 3], w = G.inner[i * 3 + 1];
      if (e) b += '<span class="badge inner">' + e + " error" + (e > 1 ? "s" : "") + " inside</span>";
      else if (w) b += '<span class="badge inner">' + w + " warning" + (w > 1 ? "s" : "") + " inside</span>";
    }
    badges.innerHTML = b;
  }

  // ---------- navigation ----------
  function reveal(i) {
    for (let p = G.parent[i]; p >= 0; p = G.parent[p]) G.expanded[p] = 1;
    if (G.included && !G.included[i]) clearFilters();
    rebuild();
    select(i, true);
  }

  function select(i, scroll) {
    selected = i;
    if (scroll) {
      const pos = visible.indexOf(i);
      if (pos >= 0) {
        const y = pos * ROW;
        if (y < tree.scrollTop || y + ROW > tree.scrollTop + tree.clientHeight)
          tree.scrollTop = Math.max(0, y - tree.clientHeight / 3);
      }
    }
    render();
    showDetail(i);
  }

  function toggle(i) {
    if (!G.children[i].length) return;
    G.expanded[i] = G.expanded[i] ? 0 : 1;
    rebuild();
  }

  function move(delta) {
    if (!visible.length) return;
    let pos = visible.indexOf(selected);
    pos = pos < 0 ? 0 : Math.max(0, Math.min(visible.length - 1, pos + delta));
    select(visible[pos], true);
  }

  tree.addEventListener("scroll", () => render());
  tree.addEventListener("click", (ev) => {
    const row = ev.target.closest(".row");
    if (!row || row.dataset.index === "") return;
    const i = +row.dataset.index;
    if (ev.target.classList.contains("tw")) toggle(i);
    select(i, false);
    tree.focus();
  });
  tree.addEventListener("dblclick", (ev) => {
    const row = ev.target.closest(".row");
    if (row && row.dataset.index !== "") toggle(+row.dataset.index);
  });

  document.addEventListener("keydown", (ev) => {
    if (ev.target === search) {
      if (ev.key === "Enter") { ev.preventDefault(); nextMatch(ev.shiftKey ? -1 : 1); }
      else if (ev.key === "Escape") { search.blur(); tree.focus(); }
      return;
    }
    if (ev.target.tagName === "SELECT" || ev.target.tagName === "INPUT") return;
    const k = ev.key;
    if (k === "ArrowDown" || k === "s" || k === "S") move(1);
    else if (k === "ArrowUp" || k === "w" || k === "W") move(-1);
    else if (k === "PageDown") move(Math.floor(tree.clientHeight / ROW));
    else if (k === "PageUp") move(-Math.floor(tree.clientHeight / ROW));
    else if (k === "Home") move(-visible.length);
    else if (k === "End") move(visible.length);
    else if (k === "ArrowRight" || k === "d" || k === "D") {
      if (selected < 0) return move(0);
      if (G.children[selected].length && !G.expanded[selected]) toggle(selected);
      else move(1);
    } else if (k === "ArrowLeft" || k === "a" || k === "A") {
      if (selected < 0) return move(0);
      if (G.expanded[selected]) toggle(selected);
      else if (G.parent[selected] >= 0) select(G.parent[selected], true);
    } else if (k === "Enter") { if (selected >= 0) toggle(selected); }
    else if (k === "/") { ev.preventDefault(); search.focus(); search.select(); }
    else if (k === "n") nextMatch(1);
    else if (k === "N") nextMatch(-1);
    else if (k === "e") nextVerdict(V.error);
    else if (k === "*") expandAll(1);
    else if (k === "-") expandAll(0);
    else return;
    ev.preventDefault();
  });

  function expandAll(open) {
    G.expanded.fill(open);
    rebuild();
    if (selected >= 0) select(selected, true);
  }
  $("expand-all").addEventListener("click", () => expandAll(1));
  $("collapse-all").addEventListener("click", () => expandAll(0));

  function nextVerdict(v) {
    for (let s = 1; s <= G.n; s++) {
      const i = (Math.max(selected, -1) + s + G.n) % G.n;
      if (G.verdict[i] === v) return reveal(i);
    }
  }

  // ---------- search ----------
  let searchTimer = 0;
  search.addEventListener("input", () => { clearTimeout(searchTimer); searchTimer = setTimeout(runSearch, 120); });

  function runSearch() {
    const q = search.value.trim().toLowerCase();
    matches = []; matchPos = -1; matchSet = null;
    if (q) {
      for (let i = 0; i < G.n; i++) if (G.lower[i].indexOf(q) >= 0) matches.push(i);
      matchSet = new Set(matches);
    }
    $("search-count").textContent = q ? (matches.length ? "1 / " + matches.length : "no match") : "";
    if (matches.length) { matchPos = 0; reveal(matches[0]); } else render();
  }

  function nextMatch(d) {
    if (!matches.length) return runSearch();
    matchPos = (matchPos + d + matches.length) % matches.length;
    $("search-count").textContent = (matchPos + 1) + " / " + matches.length;
    reveal(matches[matchPos]);
  }

  // ---------- filters ----------
  document.querySelectorAll("#filters input").forEach((box) => {
    box.addEventListener("change", () => {
      if (box.checked) filters.add(box.dataset.filter); else filters.delete(box.dataset.filter);
      applyFilters();
    });
  });

  function clearFilters() {
    filters.clear();
    document.querySelectorAll("#filters input").forEach((b) => { b.checked = false; });
    G.included = null;
  }

  function applyFilters() {
    if (!filters.size) { G.included = null; rebuild(); return; }
    const inc = new Uint8Array(G.n);
    let first = -1;
    for (let i = 0; i < G.n; i++) {
      const v = VERDICTS[G.verdict[i]];
      const hit = filters.has(v) || (filters.has("overflow") && G.overflow[i] > 0);
      if (!hit) continue;
      if (first < 0) first = i;
      inc[i] = 1;
      for (let p = G.parent[i]; p >= 0 && !inc[p]; p = G.parent[p]) inc[p] = 1;
    }
    for (let i = 0; i < G.n; i++) if (inc[i] && hasChildIn(inc, i)) G.expanded[i] = 1;
    G.included = inc;
    rebuild();
    tree.scrollTop = 0;
    if (first >= 0) select(first, true); else { selected = -1; detail.innerHTML = '<p class="hint">Nothing matches these filters.</p>'; }
  }

  function hasChildIn(inc, i) {
    const c = G.children[i];
    for (let k = 0; k < c.length; k++) if (inc[c[k]]) return true;
    return false;
  }

  // ---------- detail panel ----------
  const esc = (s) => String(s).replace(/[&<>"]/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;" }[c]));

  function fmt(v) {
    if (v === null || v === undefined || v === "") return "";
    if (v === true || v === false) return v ? "True" : "False";  // as the compare CSV writes them
    if (typeof v === "number") {
      if (Number.isInteger(v)) return String(v);
      const a = Math.abs(v);
      return (a !== 0 && (a < 1e-4 || a >= 1e6)) ? v.toExponential(6) : String(+v.toPrecision(7));
    }
    return String(v);
  }

  function cell(row, col, name) {
    const j = col[name];
    return j === undefined ? undefined : row[j];
  }

  function showDetail(i) {
    const compared = !!G.compare_mode;
    let h = "<h2>" + esc(G.names[i]) + "</h2><div class=\"meta\">";
    h += "<b>kind</b> " + doc.kinds[G.kind[i]];
    if (compared) h += " &nbsp; <b>verdict</b> <span id=\"detail-verdict\">" + VERDICTS[G.verdict[i]] + "</span>";
    if (compared && G.diagnosis[i]) h += ' &nbsp; <b>diagnosis</b> <span id="detail-diagnosis">' + esc(G.diagnosis[i]) + "</span>";
    if (compared) h += " &nbsp; <b>golden</b> " + (G.match[i] ? esc(G.match[i]) : "<i>no match</i>");
    if (G.overflow[i]) h += " &nbsp; <b>overflow</b> " + doc.overflow_levels[G.overflow[i]];
    if (G.parent[i] >= 0) h += "<br><b>in</b> " + esc(G.names[G.parent[i]]);
    const sus = (G.suspects || []).filter((s) => s.node === i);
    if (sus.length) h += "<br><b>diagnosis</b> " + sus.map((s) => esc(s.why || s.name)).join("; ");
    h += "</div>";
    const rows = rowsOf(G, i);
    if (!rows) { detail.innerHTML = h + '<p class="hint">loading\u2026</p>'; return; }
    const col = {}; G.columns.forEach((c, j) => { col[c] = j; });
    h += "<h3>Tensors (" + rows.length + ")</h3>";
    if (!rows.length) h += '<p class="hint">No data recorded for this node.</p>';
    let lastRole = "";
    for (const r of rows) {
      const role = roleOf(G.names[i], r[col["NPU Name"]] && r[col["NPU Name"]] !== "N/A" ? r[col["NPU Name"]] : r[col["Bench Name"]]);
      if (role !== lastRole) { h += '<h4 class="role">' + role + "</h4>"; lastRole = role; }
      h += tensorCard(r, col, compared);
    }
    if (G.stack[i] >= 0) h += "<h3>Call stack</h3><pre class=\"stack\">" + esc(G.stacks[G.stack[i]].join("\n")) + "</pre>";
    detail.innerHTML = h;
  }

  const PAIRS = [["dtype", "NPU Dtype", "Bench Dtype"], ["shape", "NPU Tensor Shape", "Bench Tensor Shape"],
    ["max", "NPU max", "Bench max"], ["min", "NPU min", "Bench min"], ["mean", "NPU mean", "Bench mean"],
    ["l2norm", "NPU l2norm", "Bench l2norm"], ["md5", "NPU MD5", "BENCH MD5"],
    ["requires_grad", "NPU Requires_grad", "Bench Requires_grad"]];
  const NOT_METRIC = new Set(["NPU Name", "Bench Name", "Result", "Err_message", "Value", "Data_name", "Diagnosis"]);

  PAIRS.forEach((p) => { NOT_METRIC.add(p[1]); NOT_METRIC.add(p[2]); });

  // "inputs" / "outputs" / "parameters" / "parameter gradients", from the part of the name after the node's.
  const ROLES = { input: "inputs", output: "outputs", parameters: "parameters", parameters_grad: "parameter gradients" };
  function roleOf(node, tensor) {
    const rest = String(tensor || "").startsWith(node + ".") ? tensor.slice(node.length + 1) : String(tensor || "");
    const head = rest.split(".")[0];
    if (node.indexOf(".parameters_grad.") >= 0) return ROLES.parameters_grad;
    return ROLES[head] || "values";
  }

  // Err_message is a JSON list of messages in our tables and plain text in msProbe's.
  function messages(v) {
    if (!v) return "";
    if (typeof v === "string" && v.charAt(0) === "[") {
      try { return JSON.parse(v).join("; "); } catch (e) { return v; }
    }
    return String(v);
  }

  function tensorCard(r, col, compared) {
    const tname = cell(r, col, "NPU Name");
    const bname = cell(r, col, "Bench Name");
    const result = cell(r, col, "Result");
    const shown = (tname && tname !== "N/A") ? tname : bname;
    let v = "none";
    if (compared) {
      const t = String(result || "").toLowerCase();
      v = (!bname || bname === "N/A") ? "unmatched" : t.indexOf("error") >= 0 ? "error" : t.indexOf("warning") >= 0 ? "warning" : t.indexOf("pass") >= 0 ? "pass" : t.indexOf("unmatch") >= 0 ? "unmatched" : "none";
    }
    let h = '<div class="tensor v-' + v + '" data-name="' + esc(shown) + '"><div class="th"><span>' + esc(shown) + "</span>";
    if (compared && result !== undefined) h += '<span class="result" data-col="Result">' + esc(fmt(result)) + "</span>";
    const label = cell(r, col, "Diagnosis");
    if (compared && label) h += '<span class="diag d-' + esc(label) + '" data-col="Diagnosis">' + esc(label) + "</span>";
    h += "</div>";
    const value = cell(r, col, "Value");
    if (value) h += '<div class="err">' + esc(value) + "</div>";
    h += "<table><tr><th></th><th>target</th>" + (compared ? "<th>golden</th>" : "") + "</tr>";
    if (compared && tname !== bname)  // matched under another name (mapping, fuzzy match), or unmatched
      h += "<tr><td>name</td><td>" + esc(fmt(tname)) + "</td><td>" + esc(fmt(bname)) + "</td></tr>";
    for (const [label, tc, bc] of PAIRS) {
      const a = cell(r, col, tc), b = cell(r, col, bc);
      if ((a === undefined || a === null || a === "") && (b === undefined || b === null || b === "")) continue;
      h += "<tr><td>" + label + '</td><td data-col="' + esc(tc) + '">' + esc(fmt(a)) + "</td>";
      if (compared) h += '<td data-col="' + esc(bc) + '">' + esc(fmt(b)) + "</td>";
      h += "</tr>";
    }
    h += "</table>";
    const metrics = G.columns.filter((c) => !NOT_METRIC.has(c) && r[col[c]] !== null && r[col[c]] !== "");
    if (metrics.length) {
      h += '<table class="metrics"><tr><th>metric</th><th>value</th></tr>';
      for (const m of metrics) h += "<tr><td>" + esc(m) + '</td><td data-col="' + esc(m) + '">' + esc(fmt(r[col[m]])) + "</td></tr>";
      h += "</table>";
    }
    const err = messages(cell(r, col, "Err_message"));
    if (err) h += '<div class="err" data-col="Err_message">' + esc(err) + "</div>";
    return h + "</div>";
  }

  // ---------- step / rank selection ----------
  const stepSel = $("step-select"), rankSel = $("rank-select");
  const steps = [...new Set(doc.graphs.map((g) => g.step))].sort((a, b) => a - b);

  function fillRanks(step) {
    const ranks = doc.graphs.filter((g) => g.step === step).map((g) => g.rank).sort((a, b) => a - b);
    rankSel.innerHTML = ranks.map((r) => "<option value=\"" + r + "\">" + r + "</option>").join("");
  }

  let showing = 0;
  async function showGraph(step, rank) {
    const t = performance.now();
    const my = ++showing;
    document.body.dataset.ready = "0";
    const g = doc.graphs.find((x) => x.step === step && x.rank === rank) || doc.graphs[0];
    if (!g.children) await loadTree(g);
    if (my !== showing) return;
    G = g;
    selected = -1; matches = []; matchSet = null; matchPos = -1;
    $("search-count").textContent = "";
    filters.clear();
    document.querySelectorAll("#filters input").forEach((b) => { b.checked = false; });
    document.querySelector(".f-overflow").hidden = !g.overflow_check;
    for (const v of ["error", "warning", "unmatched"]) document.querySelector(".f-" + v).hidden = !g.compare_mode;
    G.included = null;
    tree.scrollTop = 0;
    rebuild();
    legend();
    startHere();
    detail.innerHTML = '<p class="hint">Select a node: click, or the arrow keys (W/S/A/D). Enter expands, * / - expand / collapse all, / searches, n / N jump between matches, e jumps to the next error.</p>';
    if (search.value.trim()) runSearch();
    const treeMs = performance.now() - t;
    if (!g.detailLoaded) await loadDetail(g);
    if (my !== showing) return;
    if (selected >= 0) showDetail(selected);
    // For the benchmark: times since navigation start (performance.now) and since this graph was asked for.
    window.__graphReady = { treeMs: treeMs, readyMs: performance.now() - t, treeAt: t + treeMs,
      readyAt: performance.now(), nodes: G.n, domRows: spacer.children.length };
    document.body.dataset.graph = G.step + ":" + G.rank;
    document.body.dataset.ready = "1";
  }

  function legend() {
    const counts = {};
    for (let i = 0; i < G.n; i++) counts[G.verdict[i]] = (counts[G.verdict[i]] || 0) + 1;
    let h = "<span>" + G.n + " nodes</span>";
    if (G.compare_mode) for (const v of ["pass", "warning", "error", "unmatched"])
      h += '<span><span class="chip" style="background:var(--' + v + ')"></span>' + v + " " + (counts[V[v]] || 0) + "</span>";
    $("legend").innerHTML = h;
    $("title").textContent = (G.compare_mode ? "compare (" + G.compare_mode + ")" : "graph") + " \u2014 " + (G.framework || "");
  }

  function startHere() {
    const box = $("start-here");
    if (G.start_here < 0) { box.hidden = true; return; }
    const s = G.suspects[0];
    box.hidden = false;
    box.innerHTML = "<b>Start here:</b> " + esc(G.names[G.start_here]) + (s && s.why ? " \u2014 " + esc(s.why) : "") +
      ' <button id="go-start">show</button>';
    $("go-start").onclick = () => reveal(G.start_here);
  }

  stepSel.innerHTML = steps.map((s) => "<option value=\"" + s + "\">" + s + "</option>").join("");
  stepSel.addEventListener("change", () => { fillRanks(+stepSel.value); showGraph(+stepSel.value, +rankSel.value); });
  rankSel.addEventListener("change", () => showGraph(+stepSel.value, +rankSel.value));
  doc.graphs.forEach((g, i) => { g.index = i; });
  fillRanks(steps[0]);
  showGraph(steps[0], +rankSel.value);
})();

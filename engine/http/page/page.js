// prune-engine's highlighting page (served by `prune api` at GET /; docs/http-api.md).
// Text a user gives is only ever set as text (textContent, text nodes), never as HTML.
// The API key lives in this tab's sessionStorage and the Authorization header, never in
// the URL. The view's state (question, passages, options) lives in the URL.
"use strict";
(function () {
  const $ = (id) => document.getElementById(id);
  // Longer links are cut by browsers, proxies and servers; a view past this says so
  // instead of writing a link that would not reproduce it.
  const MAX_URL_CHARS = 8000;
  const KEY = "prune-engine-api-key";
  let info = null;       // /info
  let view = null;       // {state, results, local}: the last answer

  // ------------------------------------------------------------------ the family's rule
  // engine/pipeline/decide.py, as /info states it (defaults: keep_rule, title, alpha, passage_margin,
  // zero_rerank_when_empty). tests/server/test_page.py holds these against the engine.
  function keepMask(probs, rule, threshold) {
    const n = probs.length;
    const kept = probs.map((p) => (rule.keep_rule === "gt" ? p > threshold : p >= threshold));
    const useTitle = rule.title === "first_sentence" && n > 1;
    const start = useTitle ? 1 : 0;
    if (rule.alpha !== null && n && !kept.slice(start).some(Boolean)) {
      let best = start;
      for (let i = start + 1; i < n; i++) if (probs[i] > probs[best]) best = i;   // the first maximum
      if (probs[best] >= rule.alpha) kept[best] = true;
    }
    if (useTitle) kept[0] = kept[0] || kept.slice(1).some(Boolean);
    return kept;
  }

  const chars = (s) => Array.from(s);   // offsets are code points, as the engine counts them

  function prunedText(context, sentences, kept) {
    const cps = chars(context);
    const parts = [];
    let any = false;
    sentences.forEach((s, i) => {
      if (!kept[i]) return;
      if (any) {
        const gap = i > 0 ? cps.slice(sentences[i - 1].end, s.start).join("") : "";
        parts.push(gap.trim() === "" ? gap : " ");
      }
      parts.push(s.text);
      any = true;
    });
    return parts.join("");
  }

  // A call's results at `threshold` from the returned numbers: the sentence rule, the
  // zero-rerank rule, the passage gate (float32, as the engine), then top_k.
  function decide(results, rule, threshold, topK) {
    let out = results.map((r) => {
      const probs = r.sentences.map((s) => s.probability);
      const kept = keepMask(probs, rule, threshold);
      let score = r.raw_score;
      if (rule.zero_rerank_when_empty && score !== null && !kept.some(Boolean)) score = 0.0;
      return { ...r, kept, reranking_score: score };
    });
    if (rule.passage_margin !== null) {
      const scores = out.filter((r) => r.reranking_score !== null).map((r) => Math.fround(r.reranking_score));
      if (scores.length) {
        const floor = Math.fround(Math.fround(Math.max(...scores)) - Math.fround(rule.passage_margin));
        out = out.map((r) => (r.reranking_score === null || Math.fround(r.reranking_score) >= floor ? r
          : { ...r, kept: r.kept.map(() => false) }));
      }
    }
    out = out.map((r) => {
      const pruned = prunedText(r.context, r.sentences, r.kept);
      const length = chars(r.context).length;
      return { ...r, pruned_context: pruned, compression_rate: length ? Math.max(0, 1 - chars(pruned).length / length) : 0 };
    });
    if (topK !== null) {
      out = out.slice().sort((a, b) => (a.reranking_score === null) - (b.reranking_score === null)
        || (b.reranking_score || 0) - (a.reranking_score || 0) || a.index - b.index).slice(0, topK);
    }
    return out;
  }

  // ------------------------------------------------------------------ the server
  function headers(json) {
    const h = json ? { "Content-Type": "application/json" } : {};
    const key = sessionStorage.getItem(KEY);
    if (key) h.Authorization = "Bearer " + key;
    return h;
  }

  class NeedsKey extends Error {}

  async function call(path, body) {
    const init = body === undefined ? { headers: headers(false) }
      : { method: "POST", headers: headers(true), body: JSON.stringify(body) };
    const res = await fetch(path, init);
    if (res.status === 401) throw new NeedsKey("this server needs its API key");
    let data = null;
    try { data = await res.json(); } catch (e) { /* not JSON: the status says it */ }
    if (!res.ok) throw new Error((data && (data.message || data.error)) || `${res.status} ${res.statusText}`);
    return data;
  }

  function askKey(message) {
    $("key-form").hidden = false;
    $("api-key").focus();
    say(message, true);
  }

  function say(message, error) {
    $("status").textContent = message;
    $("status").className = error ? "error" : "";
  }

  // ------------------------------------------------------------------ state and URL
  const number = (v) => (v === null || v === "" || v === undefined ? null : Number(v));

  function readForm() {
    const passages = $("passages").value.split(/\n[ \t]*\n/).map((p) => p.trim()).filter((p) => p !== "");
    return { q: $("question").value.trim(), p: passages, threshold: number($("threshold").value),
             lexical_weight: number($("lexical_weight").value), top_k: number($("top_k").value) };
  }

  function fillForm(state) {
    $("question").value = state.q;
    $("passages").value = state.p.join("\n\n");
    for (const k of ["threshold", "lexical_weight", "top_k"]) $(k).value = state[k] === null ? "" : String(state[k]);
  }

  function readUrl() {
    const u = new URLSearchParams(location.search);
    return { q: u.get("q") || "", p: u.getAll("p"), threshold: number(u.get("threshold")),
             lexical_weight: number(u.get("lexical_weight")), top_k: number(u.get("top_k")) };
  }

  function link(state) {
    const u = new URLSearchParams();
    u.set("q", state.q);
    for (const p of state.p) u.append("p", p);
    for (const k of ["threshold", "lexical_weight", "top_k"]) if (state[k] !== null) u.set(k, String(state[k]));
    return location.pathname + "?" + u.toString();
  }

  // The link of this view, or a message when it would be too long to work as one.
  function writeUrl(state) {
    const url = link(state);
    const size = location.origin.length + url.length;
    if (size > MAX_URL_CHARS) {
      return `This view is too long for a link (${size} characters, the limit is ${MAX_URL_CHARS}): ` +
        "the address bar was not updated, so copying it will not reproduce this view.";
    }
    history.replaceState(null, "", url);
    return "";
  }

  // ------------------------------------------------------------------ a call
  function rule() {
    const d = info.defaults;
    return { keep_rule: d.keep_rule, title: d.title, alpha: d.alpha, passage_margin: d.passage_margin,
             zero_rerank_when_empty: d.zero_rerank_when_empty };
  }

  function defaultThreshold(state) {
    const d = info.defaults;
    const weight = state.lexical_weight === null ? d.lexical_weight : state.lexical_weight;
    return weight > 0 ? d.threshold : d.threshold_without_lexical;
  }

  async function run(state) {
    $("submit").disabled = true;
    say("pruning ...");
    try {
      const tooLong = writeUrl(state);
      const threshold = state.threshold === null ? defaultThreshold(state) : state.threshold;
      // Decided here from the numbers unless the family decides per token window: then
      // the engine decides and the slider asks it again.
      const local = !info.defaults.decides_per_window;
      const body = { question: state.q, passages: state.p };
      if (state.lexical_weight !== null) body.lexical_weight = state.lexical_weight;
      if (local) {
        body.threshold = 0;          // every probability and the raw scores; the page decides
      } else {
        body.threshold = threshold;
        if (state.top_k !== null) body.top_k = state.top_k;
      }
      const answer = await call("v1/prune", body);
      const results = answer.results.map((r) => ({ ...r, raw_score: r.reranking_score }));
      view = { state, results, local };
      $("slider").value = String(threshold);
      show(threshold);
      say(tooLong || `${results.length} passage(s) pruned by ${answer.model}.`, Boolean(tooLong));
    } catch (e) {
      if (e instanceof NeedsKey) askKey(e.message); else say(e.message, true);
    } finally {
      $("submit").disabled = false;
    }
  }

  async function slid() {
    const threshold = Number($("slider").value);
    if (!view) return;
    if (view.compressor) {
      $("rate").value = String(threshold);
      await compress({ ...view.state, rate: threshold });
      return;
    }
    if (view.local) {
      show(threshold);
    } else {
      await run({ ...view.state, threshold });
    }
  }

  // ------------------------------------------------------------------ rendering
  function show(threshold) {
    $("slider-value").textContent = threshold.toFixed(2);
    const results = view.local ? decide(view.results, rule(), threshold, view.state.top_k)
      : view.results.map((r) => ({ ...r, kept: r.sentences.map((s) => s.kept) }));
    $("slider-note").textContent = view.local ? "decided in this page from the returned probabilities"
      : "this model decides per token window: each move asks the server";
    const ranks = new Map(results.filter((r) => r.reranking_score !== null)
      .sort((a, b) => b.reranking_score - a.reranking_score).map((r, i) => [r.index, i + 1]));
    const list = $("passages-out");
    list.replaceChildren(...results.map((r) => passage(r, ranks.get(r.index))));
    $("results").hidden = false;
  }

  function el(tag, cls, text) {
    const e = document.createElement(tag);
    if (cls) e.className = cls;
    if (text !== undefined) e.textContent = text;
    return e;
  }

  function passage(r, rank) {
    const li = el("li");
    li.dataset.index = String(r.index);
    const keptCount = r.kept.filter(Boolean).length;
    const emptied = r.sentences.length > 0 && keptCount === 0;
    if (emptied) li.classList.add("emptied");
    const meta = el("div", "meta");
    const score = r.reranking_score === null ? "none (empty passage)" : r.reranking_score.toFixed(4);
    meta.append(el("span", null, `passage ${r.index + 1} · rank `), el("strong", "rank", rank ? String(rank) : "-"),
                el("span", null, " · score "), el("strong", "score", score),
                el("span", null, ` · kept ${keptCount}/${r.sentences.length} · compression `),
                el("strong", "compression", `${Math.round(100 * r.compression_rate)}%`));
    if (emptied) meta.append(el("span", "badge", "emptied"));
    const text = el("div", "text");
    const cps = chars(r.context);
    let at = 0;
    r.sentences.forEach((s, i) => {
      if (s.start > at) text.append(document.createTextNode(cps.slice(at, s.start).join("")));
      const node = el(r.kept[i] ? "mark" : "span", "sentence", cps.slice(s.start, s.end).join(""));
      node.dataset.p = String(s.probability);
      node.title = `probability ${s.probability.toFixed(3)}${r.kept[i] ? ", kept" : ""}`;
      // shading by probability (CSSOM: allowed under the page's style-src 'self')
      node.style.backgroundColor = `rgba(255, 193, 7, ${(0.15 + 0.6 * s.probability).toFixed(3)})`;
      text.append(node);
      if (r.kept[i]) text.append(el("span", "visually-hidden", " (kept)"));
      at = s.end;
    });
    if (at < cps.length) text.append(document.createTextNode(cps.slice(at).join("")));
    li.append(meta, text);
    return li;
  }

  // ------------------------------------------------------------------ an LLMLingua-2 compressor
  // In front of a compressor (/info's routes: /v1/compress) the page takes a prompt (contexts
  // apart by a blank line), a rate and force tokens, and marks the words /v1/compress kept
  // (its kept_spans); the slider is the rate, and each move asks the server again.
  const compressing = () => Boolean(info && info.routes && info.routes.includes("/v1/compress"));
  const forceTokens = (typed) => typed.split(/\s+/).filter((t) => t !== "")
    .map((t) => t.replace(/\\n/g, "\n").replace(/\\t/g, "\t"));

  function compressorForm() {
    $("question-row").hidden = true;
    $("question").required = false;
    $("passages-label").textContent = "Prompt (a blank line between two contexts)";
    $("prune-options").hidden = true;
    $("compress-options").hidden = false;
    $("submit").textContent = "Compress";
    $("rate").placeholder = String(info.defaults.rate);
    $("slider-label").firstChild.textContent = "Rate ";
    $("legend").textContent = "kept words are marked and underlined; the compressed prompt is below the contexts.";
  }

  function readCompressForm() {
    const contexts = $("passages").value.split(/\n[ \t]*\n/).map((p) => p.trim()).filter((p) => p !== "");
    return { p: contexts, rate: number($("rate").value), force: $("force").value.trim() };
  }

  function compressLink(state) {
    const u = new URLSearchParams();
    for (const p of state.p) u.append("p", p);
    if (state.rate !== null) u.set("rate", String(state.rate));
    if (state.force) u.set("force", state.force);
    return location.pathname + "?" + u.toString();
  }

  async function compress(state) {
    $("submit").disabled = true;
    say("compressing ...");
    try {
      const url = compressLink(state);
      const tooLong = location.origin.length + url.length > MAX_URL_CHARS;
      if (!tooLong) history.replaceState(null, "", url);
      const rate = state.rate === null ? info.defaults.rate : state.rate;
      const body = { context: state.p.length === 1 ? state.p[0] : state.p, rate };
      if (state.force) body.force_tokens = forceTokens(state.force);
      const answer = await call("v1/compress", body);
      view = { state, compressor: true };
      $("slider").min = "0.01";
      $("slider").value = String(rate);
      $("slider-value").textContent = rate.toFixed(2);
      $("slider-note").textContent = "each move asks the server";
      $("passages-out").replaceChildren(...state.p.map((c, i) => compressedContext(c, i, answer)));
      $("compressed").textContent = answer.compressed_prompt;
      $("compressed").hidden = false;
      $("results").hidden = false;
      const summary = `${answer.origin_tokens} tokens -> ${answer.compressed_tokens} (ratio ${answer.ratio}, rate ${answer.rate}).`;
      say(tooLong ? "This view is too long for a link: the address bar was not updated. " + summary : summary,
          tooLong);
    } catch (e) {
      if (e instanceof NeedsKey) askKey(e.message); else say(e.message, true);
    } finally {
      $("submit").disabled = false;
    }
  }

  function compressedContext(context, i, answer) {
    const li = el("li");
    li.dataset.index = String(i);
    const spans = answer.kept_spans[i] || [];
    const dropped = !answer.kept_contexts.includes(i);
    if (dropped) li.classList.add("emptied");
    const meta = el("div", "meta");
    meta.append(el("span", null, `context ${i + 1} · kept `), el("strong", "kept-words", String(spans.length)),
                el("span", null, " words"));
    if (dropped) meta.append(el("span", "badge", "dropped"));
    const text = el("div", "text");
    const cps = chars(context);
    let at = 0;
    for (const [start, end] of spans) {
      if (start > at) text.append(document.createTextNode(cps.slice(at, start).join("")));
      text.append(el("mark", "word", cps.slice(start, end).join("")));
      at = end;
    }
    if (at < cps.length) text.append(document.createTextNode(cps.slice(at).join("")));
    li.append(meta, text);
    return li;
  }

  // ------------------------------------------------------------------ start
  async function start() {
    try {
      info = await call("info");
    } catch (e) {
      if (e instanceof NeedsKey) askKey(e.message); else say(`cannot reach the engine: ${e.message}`, true);
      return;
    }
    $("key-form").hidden = true;
    $("model").textContent = `${info.model} · ${info.family} · ${info.engine}`;
    if (compressing()) {
      compressorForm();
      const u = new URLSearchParams(location.search);
      const state = { p: u.getAll("p"), rate: number(u.get("rate")), force: u.get("force") || "" };
      $("passages").value = state.p.join("\n\n");
      $("rate").value = state.rate === null ? "" : String(state.rate);
      $("force").value = state.force;
      if (state.p.length) await compress(state); else say("");
      return;
    }
    $("lexical-label").hidden = !(info.defaults.lexical_weight > 0);
    $("threshold").placeholder = String(info.defaults.threshold);
    const state = readUrl();
    fillForm(state);
    if (state.q && state.p.length) await run(state);
    else say("");
  }

  $("form").addEventListener("submit", (event) => {
    event.preventDefault();
    if (!info) { start(); return; }
    if (compressing()) {
      const state = readCompressForm();
      if (!state.p.length) { say("a prompt is needed", true); return; }
      compress(state);
      return;
    }
    const state = readForm();
    if (!state.q || !state.p.length) { say("a question and at least one passage are needed", true); return; }
    run(state);
  });
  $("key-form").addEventListener("submit", (event) => {
    event.preventDefault();
    sessionStorage.setItem(KEY, $("api-key").value);
    $("api-key").value = "";
    start();
  });
  $("slider").addEventListener("input", () => { if (view && view.local) slid(); else $("slider-value").textContent = Number($("slider").value).toFixed(2); });
  $("slider").addEventListener("change", () => { if (view && !view.local) slid(); });
  start();
})();

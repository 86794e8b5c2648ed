"""The highlighting page (`GET /` of `prune api`; engine/http/page) in a real browser:
headless Chromium (Debian's `chromium`, which `.ci/run` installs) driven by Playwright,
against real `prune api` processes.

What /v1/prune answers is the reference: the page's marks must be the engine's kept flags,
at the call's threshold and at three thresholds of the slider, which the page decides from
the returned probabilities with the family's rule as /info states it. The default model
(the embedding family: backoff, the lexical fusion, the passage gate) and a Provence test
model (the title rule) are served. Pasted `<script>` and `<img onerror>` must show as text,
and a key-protected server's page must work once the key is given, without the key ever
reaching the URL. The screenshot of the first test goes to $PRUNE_PAGE_SCREENSHOT (docs/
page.png is one).
"""

import json
import os
import shutil
import time
import urllib.error
import urllib.parse
import urllib.request

import pytest

from tests.utils import ApiProcess

pytestmark = pytest.mark.server

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
if CHROMIUM is None:
    pytest.skip(
        "no Chromium here (Debian: apt-get install chromium; .ci/run installs it)", allow_module_level=True
    )
sync_api = pytest.importorskip("playwright.sync_api", reason="Playwright comes with [dev]")

QUESTION = "Why does sourdough bread taste sour?"
PASSAGES = [
    "Sourdough bread is leavened by a starter, a fermented mixture of flour and water that holds wild yeasts "
    "and lactic acid bacteria. The bacteria produce lactic and acetic acids, which give the bread its sour taste "
    "and help it keep longer. Bakers feed the starter with fresh flour and water to keep it active.",
    "The Eiffel Tower was finished in 1889. It was the tallest structure in the world for forty years. "
    "Millions of people visit it every year.",
    "Rye flour ferments quickly and is common in sourdough across northern Europe. A slow, cool fermentation "
    "develops more of the sour flavour. Yeast alone makes a milder loaf.",
]
HOSTILE = (
    "<script>window.__pwned = 1</script> The crust is brown. "
    '<img src=x onerror="window.__pwned = 2"> It is baked at a high heat.'
)


@pytest.fixture(scope="module")
def apis(default_cache, exported, lingua_exports):
    started = {
        "default": ApiProcess(default_cache["model"]),
        "provence": ApiProcess(exported["provence"]),
        "locked": ApiProcess(exported["provence"], key="s3cret-key"),
        "compressor": ApiProcess(lingua_exports["xlm-roberta", "fp32"]),
    }
    yield started
    for a in started.values():
        a.close()


@pytest.fixture(scope="module")
def browser():
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        yield b
        b.close()


@pytest.fixture
def page(browser):
    context = browser.new_context(viewport={"width": 1100, "height": 1000})
    pg = context.new_page()
    errors = []
    pg.on("pageerror", lambda e: errors.append(str(e)))
    yield pg
    context.close()
    assert not errors, errors


def _link(api, question, passages, **options):
    query = [("q", question), *(("p", p) for p in passages), *((k, str(v)) for k, v in options.items())]
    return api.url + "/?" + urllib.parse.urlencode(query)


def _shown(page):
    """Per passage shown: index, kept flags, rank, score and compression as displayed."""
    page.wait_for_selector("#results:not([hidden]) #passages-out > li")
    return page.eval_on_selector_all(
        "#passages-out > li",
        """items => items.map(li => ({
        index: Number(li.dataset.index),
        kept: Array.from(li.querySelectorAll('.sentence')).map(s => s.tagName === 'MARK'),
        probs: Array.from(li.querySelectorAll('.sentence')).map(s => Number(s.dataset.p)),
        score: li.querySelector('.score').textContent,
        compression: li.querySelector('.compression').textContent,
        emptied: li.classList.contains('emptied')}))""",
    )


def _expected(results):
    return [
        {
            "index": r["index"],
            "kept": [s["kept"] for s in r["sentences"]],
            "probs": [s["probability"] for s in r["sentences"]],
            "score": "none (empty passage)"
            if r["reranking_score"] is None
            else f"{r['reranking_score']:.4f}",
            "compression": f"{round(100 * r['compression_rate'])}%",
            "emptied": bool(r["sentences"]) and not any(s["kept"] for s in r["sentences"]),
        }
        for r in results
    ]


def _slide(page, value):
    page.eval_on_selector(
        "#slider", "(s, v) => { s.value = v; s.dispatchEvent(new Event('input')); }", str(value)
    )


@pytest.mark.parametrize("model", ["default", "provence"])
def test_a_link_opens_answered_with_the_engines_marks_and_the_slider_decides_as_the_engine(apis, page, model):
    api = apis[model]
    page.goto(_link(api, QUESTION, PASSAGES))
    shown = _shown(page)
    assert shown == _expected(api.prune(question=QUESTION, passages=PASSAGES))
    if model == "default" and os.environ.get("PRUNE_PAGE_SCREENSHOT"):
        page.screenshot(path=os.environ["PRUNE_PAGE_SCREENSHOT"], full_page=True)
    probs = sorted(p for item in shown for p in item["probs"])
    # three thresholds between the probabilities, so each one moves some decision
    for t in (probs[len(probs) // 4], probs[len(probs) // 2], probs[3 * len(probs) // 4]):
        t = round(t, 2)
        _slide(page, t)
        assert page.text_content("#slider-value") == f"{t:.2f}"
        assert _shown(page) == _expected(api.prune(question=QUESTION, passages=PASSAGES, threshold=t)), t
    # top_k: the page ranks and cuts as the engine does
    page.goto(_link(api, QUESTION, PASSAGES, top_k=2))
    assert _shown(page) == _expected(api.prune(question=QUESTION, passages=PASSAGES, top_k=2))


def test_keyboard_use_and_the_url_holds_the_state(apis, page):
    api = apis["default"]
    page.goto(api.url + "/")
    page.wait_for_selector("#model:not(:empty)")
    page.focus("#question")
    page.keyboard.type(QUESTION)
    page.keyboard.press("Tab")
    page.keyboard.type(PASSAGES[0] + "\n\n" + PASSAGES[1])
    page.keyboard.press("Tab")  # threshold
    page.keyboard.type("0.5")
    for _ in range(3):  # lexical weight, top-k, the button
        page.keyboard.press("Tab")
    assert page.evaluate("document.activeElement.id") == "submit"
    page.keyboard.press("Enter")
    shown = _shown(page)
    assert shown == _expected(api.prune(question=QUESTION, passages=PASSAGES[:2], threshold=0.5))
    state = urllib.parse.parse_qs(urllib.parse.urlparse(page.url).query)
    assert state == {"q": [QUESTION], "p": PASSAGES[:2], "threshold": ["0.5"]}
    page.focus("#slider")  # the slider moves with the arrow keys
    page.keyboard.press("ArrowRight")
    assert page.text_content("#slider-value") == "0.51"


def test_pasted_html_is_shown_as_text(apis, page):
    api = apis["provence"]
    page.goto(_link(api, "What is baked?", [HOSTILE, "Bread is baked."]))
    _shown(page)
    assert page.evaluate("window.__pwned") is None
    assert page.locator("#passages-out img, #passages-out script").count() == 0
    text = page.text_content("#passages-out > li:first-child .text")
    assert (
        "<script>window.__pwned = 1</script>" in text and '<img src=x onerror="window.__pwned = 2">' in text
    )


def test_a_view_too_long_for_a_link_says_so(apis, page):
    api = apis["provence"]
    page.goto(api.url + "/")
    page.wait_for_selector("#model:not(:empty)")
    page.fill("#question", "What is long?")
    page.fill("#passages", "\n\n".join(["A long passage about bread and its crust. " * 20] * 12))
    page.click("#submit")
    _shown(page)
    assert "too long for a link" in page.text_content("#status")
    assert "?" not in page.url  # the address was left alone, not truncated


def test_a_key_protected_server_asks_for_the_key_once_and_keeps_it_out_of_the_url(apis, page):
    api = apis["locked"]
    with pytest.raises(urllib.error.HTTPError) as no_key:
        urllib.request.urlopen(api.url + "/info", timeout=10)
    assert no_key.value.code == 401
    with urllib.request.urlopen(api.url + "/", timeout=10) as r:  # the page itself is open
        assert r.status == 200 and b"prune-engine" in r.read()
    link = _link(api, QUESTION, PASSAGES)
    page.goto(link)
    page.wait_for_selector("#key-form:not([hidden])")
    assert page.evaluate("document.activeElement.id") == "api-key"
    page.fill("#api-key", api.key)
    page.keyboard.press("Enter")
    assert _shown(page) == _expected(api.prune(question=QUESTION, passages=PASSAGES))
    assert api.key not in page.url and page.evaluate("localStorage.length") == 0
    page.goto(link)  # the same tab: asked once
    assert _shown(page) == _expected(api.prune(question=QUESTION, passages=PASSAGES))
    assert page.is_hidden("#key-form")


def test_the_pages_headers_let_only_its_own_script_run(apis, page):
    """The page's files need no key and carry the CSP; an inline handler that reached the
    page anyway (inserted here, as an injection would) does not run under it."""
    from engine.http.app import PAGE_FILES, PAGE_HEADERS

    api = apis["locked"]
    for path, (_, media) in PAGE_FILES.items():
        with urllib.request.urlopen(api.url + path, timeout=10) as r:
            assert r.status == 200 and r.headers["Content-Type"] == media
            for k, v in PAGE_HEADERS.items():
                assert r.headers[k] == v, (path, k)
    assert "script-src 'self'" in PAGE_HEADERS["Content-Security-Policy"]
    page.goto(api.url + "/")
    page.wait_for_selector("#key-form:not([hidden])")
    page.evaluate("""() => { document.body.insertAdjacentHTML('beforeend',
        '<img src="data:," onerror="window.__csp = 1"><div onclick="window.__csp = 2" id="x">x</div>'); }""")
    page.click("#x")
    page.wait_for_timeout(300)
    assert page.evaluate("window.__csp") is None


def _compress(api, **body):
    req = urllib.request.Request(
        api.url + "/v1/compress", json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=60) as r:
        return json.loads(r.read())


def _marked(page):
    """Per context shown: its index, the words marked (as [start, end) of the context) and dropped."""
    page.wait_for_selector("#results:not([hidden]) #passages-out > li")
    return page.eval_on_selector_all(
        "#passages-out > li",
        """items => items.map(li => {
        const spans = []; let at = 0;
        for (const node of li.querySelector('.text').childNodes) {
          const n = Array.from(node.textContent).length;
          if (node.tagName === 'MARK') spans.push([at, at + n]);
          at += n;
        }
        return {index: Number(li.dataset.index), spans, dropped: li.classList.contains('emptied')};
        })""",
    )


def _expected_marks(answer, contexts):
    return [
        {"index": i, "spans": answer["kept_spans"][i], "dropped": i not in answer["kept_contexts"]}
        for i in range(len(contexts))
    ]


def test_in_front_of_a_compressor_the_page_marks_the_words_llmlingua_keeps(apis, page):
    """`prune api` on an LLMLingua-2 export: the page takes a prompt, a rate and force tokens, marks
    the words /v1/compress keeps (its kept_spans), shows the compressed prompt, and its slider (the
    rate) asks the server again; the state is in the link; pasted HTML stays text."""
    api = apis["compressor"]
    contexts = [PASSAGES[0], HOSTILE + "\nWhy is it brown?"]
    query = [*(("p", c) for c in contexts), ("rate", "0.5"), ("force", "\\n ?")]
    page.goto(api.url + "/?" + urllib.parse.urlencode(query))
    answer = _compress(api, context=contexts, rate=0.5, force_tokens=["\n", "?"])
    assert _marked(page) == _expected_marks(answer, contexts)
    assert page.text_content("#compressed") == answer["compressed_prompt"]
    assert f"{answer['origin_tokens']} tokens -> {answer['compressed_tokens']}" in page.text_content(
        "#status"
    )
    assert page.is_hidden("#question-row") and page.text_content("#submit") == "Compress"
    assert page.evaluate("window.__pwned") is None
    # the slider is the rate: a change asks the server
    page.eval_on_selector("#slider", "s => { s.value = '0.3'; s.dispatchEvent(new Event('change')); }")
    at_03 = _compress(api, context=contexts, rate=0.3, force_tokens=["\n", "?"])
    # polled from here: Playwright's wait_for_function evaluates a string, which the page's CSP forbids
    deadline = time.monotonic() + 30
    while not (
        page.input_value("#rate") == "0.3"
        and not page.is_disabled("#submit")
        and page.text_content("#compressed") == at_03["compressed_prompt"]
    ):
        assert time.monotonic() < deadline, "the page did not show the answer at rate 0.3"
        time.sleep(0.05)
    assert _marked(page) == _expected_marks(at_03, contexts)
    state = urllib.parse.parse_qs(urllib.parse.urlparse(page.url).query)
    assert state == {"p": contexts, "rate": ["0.3"], "force": ["\\n ?"]}
    # the form: one context, the model's default rate
    page.goto(api.url + "/")
    page.wait_for_selector("#model:not(:empty)")
    page.fill("#passages", PASSAGES[2])
    page.click("#submit")
    page.wait_for_selector("#results:not([hidden])")
    one = _compress(api, context=PASSAGES[2], rate=0.5)
    assert _marked(page) == _expected_marks(one, [PASSAGES[2]])

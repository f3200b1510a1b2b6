"""The docs site builds offline from the notebooks and renders in a real browser (headless Chromium).

Screenshots of the index page and of a chapter are saved to _build/artifacts/ as artefacts of the run."""
import http.server
import json
import re
import subprocess
import sys
import threading
from functools import partial
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import urljoin, urlparse

import pytest
import yaml
from conftest import ROOT, default_exp

SITE = ROOT / "_build" / "site"
ARTIFACTS = ROOT / "_build" / "artifacts"
# the chapter whose maths and figures are checked in the browser (it has both)
CHAPTER = "core.html"


def _page_name(nb: Path) -> str:
    "The page Quarto (and our build) makes of a notebook: nbdev drops the number prefix."
    return re.sub(r"^\d+[a-z]?_", "", nb.stem) + ".html"


def _sidebar_notebooks() -> list[str]:
    def walk(items):
        for it in items:
            if isinstance(it, str):
                yield it
            elif isinstance(it, dict) and "contents" in it:
                yield from walk(it["contents"])
            elif isinstance(it, dict) and "href" in it:
                yield it["href"]
    data = yaml.safe_load((ROOT / "nbs" / "sidebar.yml").read_text())
    return list(walk(data["website"]["sidebar"]["contents"]))


NOTEBOOKS = sorted(p for p in (ROOT / "nbs").glob("*.ipynb") if not p.name.startswith(("_", ".")))


@pytest.fixture(scope="session")
def site():
    res = subprocess.run([sys.executable, str(ROOT / "scripts" / "build_docs.py"), "--out", str(SITE)],
                         cwd=ROOT, capture_output=True, text=True, timeout=1800)
    assert res.returncode == 0, f"docs build failed:\n{res.stdout[-3000:]}\n{res.stderr[-3000:]}"
    return SITE


class _Links(HTMLParser):
    def __init__(self):
        super().__init__()
        self.links, self.ids = [], set()

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if a.get("id"):
            self.ids.add(a["id"])
        for key in ("href", "src"):
            if a.get(key) and not (tag == "link" and a.get("rel") in ("canonical",)):
                self.links.append(a[key])


def _parse(path: Path) -> _Links:
    p = _Links()
    p.feed(path.read_text())
    return p


def test_sidebar_lists_every_notebook_in_curriculum_order():
    listed = _sidebar_notebooks()
    names = [p.name for p in NOTEBOOKS]
    expected = ["index.ipynb"] + sorted(n for n in names if n != "index.ipynb")
    assert listed == expected, f"nbs/sidebar.yml should list {expected} in this order, it lists {listed}"


def _api_page(nb: Path) -> str:
    "A chapter's reference page: the API entries of its module."
    return "api_" + _page_name(nb)


CHAPTERS = [nb for nb in NOTEBOOKS if default_exp(nb)]


LOG_PAGES = ["speedrun_log.html", "gamerun_log.html"]  # the saved runs' development logs (docs/*/LOG.md)


def test_one_page_per_notebook_one_reference_per_module_and_the_logs(site):
    pages = sorted(p.name for p in site.glob("*.html"))
    assert pages == sorted([_page_name(nb) for nb in NOTEBOOKS] + [_api_page(nb) for nb in CHAPTERS] + LOG_PAGES)
    for log in LOG_PAGES:  # a log page shows its entries under the log's own title
        html = (site / log).read_text(encoding="utf-8")
        assert "development log" in html and html.count("<h2") >= 3, log


def test_api_reference_documents_every_public_name(site):
    """Each module's reference page carries an entry for every public function and class it exports, and the chapter
    keeps an anchor of the same name where it explains it (so links to `chapter.html#name` land in the text)."""
    import importlib
    import inspect

    for nb in CHAPTERS:
        mod = importlib.import_module(f"agent_r1_tutorial.{default_exp(nb)[0]}")
        ref, chapter = _parse(site / _api_page(nb)).ids, _parse(site / _page_name(nb)).ids
        public = [n for n in mod.__all__ if inspect.isfunction(getattr(mod, n)) or inspect.isclass(getattr(mod, n))]
        assert public, f"{mod.__name__} exports nothing"
        missing = [n for n in public if n.lower() not in ref]
        assert not missing, f"{_api_page(nb)} has no entry for {missing}"
        unanchored = [n for n in public if n.lower() not in chapter]
        assert not unanchored, f"{_page_name(nb)} has no anchor for {unanchored}"


def test_chapters_keep_reference_out_of_the_reading_column(site):
    "No API entry (a rule, then a heading and a parameter table) is left in a chapter; each chapter links its reference."
    for nb in CHAPTERS:
        html = (site / _page_name(nb)).read_text(encoding="utf-8")
        entries = re.findall(r"<hr[^>]*>\s*<h3 id=", html)
        assert not entries, f"{_page_name(nb)} still holds {len(entries)} API entries"
        assert f'href="{_api_page(nb)}"' in html, f"{_page_name(nb)} does not link {_api_page(nb)}"


def test_no_internal_link_is_broken(site):
    pages = {p: _parse(p) for p in site.rglob("*.html")}
    broken = []
    for page, parsed in pages.items():
        for link in parsed.links:
            u = urlparse(link)
            if u.scheme in ("http", "https", "mailto", "data", "javascript") or link.startswith("//"):
                continue
            target = (page.parent / u.path).resolve() if u.path else page
            if u.path.endswith("/") or (target.is_dir()):
                target = target / "index.html"
            if not target.exists():
                broken.append(f"{page.name}: {link}")
            elif u.fragment and target.suffix == ".html":
                ids = pages[target].ids if target in pages else _parse(target).ids
                if u.fragment not in ids:
                    broken.append(f"{page.name}: {link} (no such anchor)")
    assert not broken, "broken internal links:\n" + "\n".join(broken)


def test_the_site_needs_no_network(site):
    "No page loads a script, stylesheet, image or frame from another host; KaTeX is bundled."
    external = re.compile(r"""<(?:script|link|img|iframe)\b[^>]*\b(?:src|href)=["'](?:https?:)?//""", re.I)
    offenders = [p.name for p in site.rglob("*.html") if external.search(p.read_text())]
    css = re.compile(r"""(@import|url\()\s*['"]?(?:https?:)?//""", re.I)
    offenders += [p.name for p in site.rglob("*.css") if css.search(p.read_text())]
    assert not offenders
    assert (site / "site_libs" / "katex" / "katex.min.js").exists()
    assert list((site / "site_libs" / "katex" / "fonts").glob("*.woff2"))


def test_no_page_shows_the_build_machine(site):
    "No page carries a path of the machine that built it, a Python warning, or a raw widget repr."
    import re
    leak = re.compile(r"site-packages|/tmp/|/work/|/root/|/home/\w|UserWarning|DeprecationWarning|VBox\(children=")
    found = [f"{p.name}: {m.group(0)}" for p in sorted(site.glob("*.html"))
             for m in [leak.search(re.sub(r"<[^>]+>", "", p.read_text(encoding="utf-8")))] if m]
    assert not found, "pages that show the build machine:\n" + "\n".join(found)


def test_full_text_search_index(site):
    entries = json.loads((site / "search.json").read_text())
    hrefs = {e["href"].split("#")[0] for e in entries}
    assert {_page_name(nb) for nb in NOTEBOOKS} <= hrefs
    text = " ".join(e["text"] for e in entries if e["href"].startswith(CHAPTER))
    assert "torn last line" in text  # body text of the chapter, not only its headings


def test_readme_is_made_from_index():
    res = subprocess.run([sys.executable, str(ROOT / "scripts" / "build_docs.py"), "--check-readme"],
                         cwd=ROOT, capture_output=True, text=True)
    assert res.returncode == 0, res.stdout + res.stderr
    readme = (ROOT / "README.md").read_text()
    assert "bash speedrun.sh" in readme and "bash scripts/test.sh" in readme


# ---- in the browser


@pytest.fixture(scope="session")
def server(site):
    handler = partial(_QuietHandler, directory=str(site))
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{srv.server_address[1]}/"
    srv.shutdown()


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *a):
        pass


@pytest.fixture(scope="module")  # module scope: Playwright's event loop must not outlive these tests
def browser():
    from find_chromium import find_chromium
    from playwright.sync_api import sync_playwright

    exe = find_chromium()
    assert exe, "no Chromium: scripts/setup.sh dev installs one"
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=exe, args=[
            "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
            "--disable-sync", "--disable-quic", "--no-first-run"])
        yield b
        b.close()


def _open(browser, url):
    "Load a page, recording console errors, page errors, failed requests and any request to another host."
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    problems = []
    host = urlparse(url).netloc

    def route(r):
        if urlparse(r.request.url).netloc not in (host, ""):
            problems.append(f"network request to {r.request.url}")
            return r.abort()
        return r.continue_()
    page.route("**/*", route)
    page.on("console", lambda m: m.type == "error" and problems.append(f"console error: {m.text}"))
    page.on("pageerror", lambda e: problems.append(f"page error: {e}"))
    page.on("requestfailed", lambda r: problems.append(f"failed request: {r.url}"))
    page.on("response", lambda r: r.status >= 400 and problems.append(f"HTTP {r.status}: {r.url}"))
    page.goto(url, wait_until="networkidle")
    return page, problems


def test_every_page_loads_cleanly(site, server, browser):
    for html in sorted(site.glob("*.html")):
        page, problems = _open(browser, server + html.name)
        title = page.title()
        page.close()
        assert not problems, f"{html.name}: " + "; ".join(problems)
        assert title, f"{html.name} has no title"


def _check_math(page):
    n_math = page.evaluate("document.querySelectorAll('span.math').length")
    n_rendered = page.evaluate("document.querySelectorAll('span.math .katex').length")
    n_errors = page.evaluate("document.querySelectorAll('.katex-error').length")
    assert n_math > 0 and n_rendered == n_math and n_errors == 0, (n_math, n_rendered, n_errors)
    # KaTeX draws with its own fonts; they must have loaded from the site
    assert page.evaluate("document.fonts.check('16px KaTeX_Main')")
    return n_math


def test_index_renders_map_and_math(site, server, browser):
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page, problems = _open(browser, server + "index.html")
    assert not problems
    _check_math(page)
    # the curriculum map: a table row for every chapter, ready ones linked to their pages
    rows = page.evaluate("[...document.querySelectorAll('table tr')].map(r => r.innerText)")
    # every chapter (the 9x notebooks are pages for contributors, linked from the sidebar, not chapters)
    chapters = [nb for nb in NOTEBOOKS if nb.name != "index.ipynb" and not nb.name.startswith("9")]
    for nb in chapters:
        assert any(nb.stem.split("_", 1)[1] in r.lower() or nb.stem[:2] in r for r in rows), nb.name
    links = page.evaluate("[...document.querySelectorAll('main table a')].map(a => a.getAttribute('href'))")
    assert CHAPTER in links
    # every chapter is written, so every row links to its page, and every link resolves
    pages = {l for l in links if not l.startswith("http") and "#" not in l}  # (anchors are API links in the text)
    assert len(pages) == len(chapters), sorted(pages)
    assert all((site / l).exists() for l in pages), sorted(pages)
    page.screenshot(path=str(ARTIFACTS / "index.png"), full_page=True)
    page.close()


def test_chapter_renders_math_figures_and_api(site, server, browser):
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page, problems = _open(browser, server + CHAPTER)
    assert not problems
    _check_math(page)
    imgs = page.evaluate("[...document.querySelectorAll('main img')].map(i => [i.naturalWidth, i.naturalHeight])")
    assert imgs and all(w > 100 and h > 100 for w, h in imgs), imgs
    assert page.evaluate("document.querySelector('#seed_everything') !== null")
    # the sidebar lists the pages in curriculum order
    side = page.evaluate("[...document.querySelectorAll('#quarto-sidebar a')].map(a => a.getAttribute('href'))")
    order = [h for h in side if h and h.endswith('.html')]
    expected = [_page_name(ROOT / "nbs" / n) for n in _sidebar_notebooks()]
    assert [h for h in order if h in expected] == expected
    page.screenshot(path=str(ARTIFACTS / "chapter.png"), full_page=True)
    page.close()


def test_search_box_finds_body_text(site, server, browser):
    page, problems = _open(browser, server + "index.html")
    page.fill("#quarto-search input", "torn last line")
    page.wait_for_selector(".search-result", timeout=10000)
    hrefs = page.evaluate("[...document.querySelectorAll('.search-result')].map(a => a.getAttribute('href'))")
    assert any(CHAPTER in h for h in hrefs), hrefs
    assert not problems
    page.close()


# what a page's layout must hold at desktop width (1280 px), measured in the browser; see `_layout_problems`
_LAYOUT_JS = """() => {
  const main = document.querySelector('main');
  const col = main.clientWidth;
  const out = {col, pre: [], tables: [], math: [], figures: [], toc_in_outputs: [], nav: 0};
  const over = el => el.scrollWidth - el.clientWidth;
  // code and API signatures; printed outputs (transcripts, logs) may scroll inside their box, and so may source a
  // reader unfolds on a reference page (a closed <details> lays its content out with no width at all)
  for (const el of main.querySelectorAll('pre.sourceCode'))
    if (el.offsetParent && !el.closest('details:not([open])') && over(el) > 2)
    out.pre.push(el.innerText.split('\\n').reduce((a, b) => a.length > b.length ? a : b).slice(0, 60));
  for (const el of main.querySelectorAll('table')) if (el.offsetParent && el.getBoundingClientRect().width > col + 2)
    out.tables.push(el.innerText.slice(0, 60));
  for (const el of main.querySelectorAll('.katex-display')) if (over(el) > 2) out.math.push(el.innerText.slice(0, 40));
  for (const img of main.querySelectorAll('img')) {
    const w = img.getBoundingClientRect().width;
    if (img.naturalWidth > 0 && w > 0 && w < Math.min(img.naturalWidth, col) * 0.5)
      out.figures.push(`${img.getAttribute('src')}: ${img.naturalWidth} px drawn at ${Math.round(w)}`);
  }
  for (const a of document.querySelectorAll('#TOC a[href^="#"]')) {
    const h = document.getElementById(decodeURIComponent(a.getAttribute('href').slice(1)));
    // an API entry (show_doc) is a cell output too, but it opens with a rule: only other outputs' headings count
    const api = h && h.previousElementSibling && h.previousElementSibling.tagName === 'HR';
    if (h && !api && h.closest('.cell-output, .cell-output-display, .cell-output-stdout')) out.toc_in_outputs.push(a.innerText);
  }
  out.nav = document.querySelectorAll('.page-navigation a').length;
  return out;
}"""


def _layout_problems(name: str, m: dict) -> list[str]:
    "What a reader would meet: code, API tables or equations wider than the column, shrunk figures, a stray TOC."
    out = [f"{name}: code block wider than the column: {s!r}" for s in m["pre"]]
    out += [f"{name}: table wider than the column: {s!r}" for s in m["tables"]]
    out += [f"{name}: display equation wider than the column: {s!r}" for s in m["math"]]
    out += [f"{name}: figure shrunk below half its size: {s}" for s in m["figures"]]
    out += [f"{name}: table of contents lists a heading from a cell's output: {s!r}" for s in m["toc_in_outputs"]]
    if m["nav"] < 1:
        out.append(f"{name}: no previous/next links")
    return out


def test_every_page_fits_its_column(site, server, browser):
    """At 1280 px no code block, API table or display equation is wider than the content column, no figure is drawn
    at less than half its size, the contents list only the page's own headings, and previous/next links exist.
    Every page is photographed at 1280 and 390 px wide into _build/artifacts/pages/."""
    shots = ARTIFACTS / "pages"
    shots.mkdir(parents=True, exist_ok=True)
    problems = []
    for html in sorted(site.glob("*.html")):
        page, errors = _open(browser, server + html.name)
        problems += [f"{html.name}: {e}" for e in errors]
        problems += _layout_problems(html.name, page.evaluate(_LAYOUT_JS))
        page.screenshot(path=str(shots / f"{html.stem}-1280.png"), full_page=True)
        page.set_viewport_size({"width": 390, "height": 844})
        page.wait_for_timeout(100)
        page.screenshot(path=str(shots / f"{html.stem}-390.png"), full_page=True)
        page.close()
    assert not problems, f"{len(problems)} layout problems:\n" + "\n".join(problems)


def test_search_ranks_the_defining_chapter_first(site, server, browser):
    "Searching a name the masks chapter defines finds the masks chapter first."
    page, problems = _open(browser, server + "index.html")
    page.fill("#quarto-search input", "response_mask")
    page.wait_for_selector(".search-result", timeout=10000)
    hrefs = page.evaluate("[...document.querySelectorAll('.search-result')].map(a => a.getAttribute('href'))")
    assert hrefs and hrefs[0].split("#")[0].endswith("masks.html"), hrefs[:5]
    assert not problems
    page.close()


def test_long_outputs_fold_and_open(site, server, browser):
    """A printed output taller than 40rem (a transcript, a table of episodes) shows folded with a button that opens it
    whole and folds it again; report cards (Markdown outputs) and figures are never folded."""
    page, problems = _open(browser, server + "envs.html")
    folded = page.query_selector_all(".cell-output.output-folded")
    assert folded, "the environments chapter's long transcripts are not folded"
    out = folded[0]
    short = out.bounding_box()["height"]
    # the whole output: the box's height, or a printed block's (a <pre> is capped and scrolls inside its box)
    full = out.evaluate("o => Math.max(o.scrollHeight, ...[...o.querySelectorAll('pre')].map(p => p.scrollHeight))")
    assert short < full * 0.8, (short, full)
    btn = out.evaluate_handle("o => o.nextElementSibling")
    assert btn.evaluate("b => b.tagName") == "BUTTON" and "Show" in btn.evaluate("b => b.textContent")
    btn.as_element().click()
    assert out.bounding_box()["height"] >= full - 2 and "Fold" in btn.evaluate("b => b.textContent")
    assert out.evaluate("o => [...o.querySelectorAll('pre')].every(p => p.scrollHeight <= p.clientHeight + 2)")
    btn.as_element().click()
    assert out.bounding_box()["height"] < full * 0.8
    assert not page.query_selector_all(".output-folded img")
    assert not problems
    page.close()
    # an output whose printed block is taller than its capped box (the launch commands, the dry run's console) is
    # folded with the button too: no block scrolls up and down inside the page with nothing to say so
    page, problems = _open(browser, server + "verl_launch.html")
    hidden = page.evaluate("[...document.querySelectorAll('.cell-output:not(.output-folded) pre')]"
                           ".filter(p => p.scrollHeight > p.clientHeight + 2).length")
    assert hidden == 0 and page.query_selector_all(".cell-output.output-folded"), hidden
    assert not problems
    page.close()
    # the text-game page's report card is a Markdown output taller than 40rem, and stays whole
    page, problems = _open(browser, server + "gamerun.html")
    cards = page.evaluate("[...document.querySelectorAll('.cell-output-markdown')].map(o => "
                          "[o.scrollHeight, o.classList.contains('output-folded')])")
    rem = page.evaluate("parseFloat(getComputedStyle(document.documentElement).fontSize)")
    assert any(h > 40 * rem for h, _ in cards), "no report card taller than the fold: the check would prove nothing"
    assert not any(folded for _, folded in cards)
    assert not problems
    page.close()


# ---- what a reader sees: the code a chapter teaches, on any screen

# The functions and classes the tutorial exists to teach: each one's full source is on its chapter's page, open, where
# the prose explains it (`#| exports`); the rest of the library is one click away on the reference pages.
TAUGHT = {
    "core.html": ["def get_device", "class Registry"],
    "mdp.html": ["class Step", "class Trajectory", "def sequence_ids", "def token_roles"],
    "masks.html": ["def growing_layout", "def step_layout", "def collate", "def compute_log_probs"],
    "tools.html": ["class BaseTool", "class ToolResult", "class ToolFormat", "class HermesFormat", "class SearchR1Format",
                   "def run_tool_calls", "def register_tool", "def truncate_text"],
    "envs.html": ["class AgentEnv", "class ToolEnv", "def _step", "def make_env", "def step_envs", "class Summarize"],
    "rollout.html": ["class AgentEnvLoop", "def run", "def generate", "def to_batch", "def sdpa_gqa"],
    "rewards.html": ["def exact_match", "def f1_score", "def format_reward", "def place_step_rewards",
                     "def compute_score"],
    "gateway.html": ["def episode_prompt_ids", "def same_message", "class Gateway", "def episode_trajectory",
                     "def collect", "def drift_cause"],
    "advantages.html": ["def compute_gae_advantage_return", "def compute_step_gae_advantage_return",
                        "def compute_grpo_outcome_advantage", "def compute_drgrpo_outcome_advantage",
                        "def compute_rloo_outcome_advantage", "def compute_reinforce_plus_plus_outcome_advantage"],
    "losses.html": ["def agg_loss", "def compute_policy_loss_vanilla", "def compute_policy_loss_gspo", "def kl_penalty",
                    "def compute_kl_loss", "def compute_value_loss", "def compute_entropy_loss"],
    "trainer.html": ["class Trainer", "def step", "def rollout", "def _scores", "def _log_probs", "def _advantages",
                     "def _policy_loss", "def _update", "def train"],
    "verl.html": ["def run_agent_episode", "def verl_agent_loop_class", "class Ar1AgentLoop"],
    "worlds.html": ["def make_split", "def arith_problem"],
    "textgames.html": ["def clean_feedback", "class GamePolicyBackend", "def play_games", "def game_metrics"],
    "blackbox.html": ["def openai_agent", "def http_search", "def httpx_agent", "class AgentTrainer", "def rollout",
                      "def held_out_em", "def train_agent_runs", "def agent_task", "class ServerManagerBackend",
                      "class Ar1GatewayLoop", "def verl_agent_stage"],
    "gamerun.html": ["def game_specs", "def sft_ready", "def weak_levels", "def rl_step_costs"],
}

_SHOWN_JS = """() => {
  const main = document.querySelector('main');
  const visible = el => !el.closest('details:not([open])');
  const code = [...main.querySelectorAll('pre code')].filter(visible).map(c => c.innerText);
  const imgs = [...main.querySelectorAll('img')].map(i => [i.getAttribute('src').slice(0, 40), i.getAttribute('alt') || '']);
  return {code, imgs};
}"""


def test_taught_code_is_shown_and_no_shown_code_switches_on_tests(site, server, browser):
    """Every name the tutorial teaches shows its `def`/`class` on its chapter page, outside any fold; no shown code
    holds `in_test()` (what a reader sees is what a reader's run does)."""
    problems = []
    for html in sorted(site.glob("*.html")):
        page, errors = _open(browser, server + html.name)
        shown = page.evaluate(_SHOWN_JS)["code"]
        page.close()
        text = "\n".join(shown)
        problems += [f"{html.name}: `{d}` is not shown" for d in TAUGHT.get(html.name, [])
                     if not re.search(re.escape(d) + r"\b", text)]
        problems += [f"{html.name}: shown code calls in_test(): {c.strip().splitlines()[0][:60]!r}"
                     for c in shown if "in_test()" in c and "def in_test" not in c]
    assert not problems, "\n".join(problems)


def test_no_page_pans_sideways_on_a_phone_and_every_figure_has_alt_text(site, server, browser):
    """At 390 px (a phone) no page is wider than the screen: wide code, tables and equations scroll inside their own
    box. Every picture has alt text for readers who cannot see it."""
    problems = []
    for html in sorted(site.glob("*.html")):
        page, errors = _open(browser, server + html.name)
        page.set_viewport_size({"width": 390, "height": 844})
        page.wait_for_timeout(50)
        width = page.evaluate("document.documentElement.scrollWidth")
        if width > 392:
            wide = page.evaluate("""() => [...document.querySelectorAll('main *')].filter(e => {
                const r = e.getBoundingClientRect(); return r.right > innerWidth + 2 && r.width > 0;
              }).slice(0, 3).map(e => e.tagName + '.' + e.className + ': ' + (e.innerText || '').slice(0, 40))""")
            problems.append(f"{html.name}: {width} px wide at 390 ({wide})")
        problems += [f"{html.name}: a picture without alt text ({src}...)"
                     for src, alt in page.evaluate(_SHOWN_JS)["imgs"] if not alt.strip()]
        page.close()
    assert not problems, f"{len(problems)} problems:\n" + "\n".join(problems)


def test_wide_figures_fit_a_phone_and_open_at_full_size(site, server, browser):
    """On a phone (390 px) a figure of several panels fits the column like any other, so that its legend and right-hand
    panels stay on screen; a line under it says a tap opens it at full size, and a tap does."""
    page = browser.new_page(viewport={"width": 390, "height": 844})
    page.goto(server + "losses.html")
    page.wait_for_load_state("load")
    imgs = page.evaluate("""() => [...document.querySelectorAll('.cell-output-display img')].map(i => ({
        natural: i.naturalWidth, shown: i.getBoundingClientRect().width,
        box: i.closest('.cell-output-display').clientWidth}))""")
    wide = [i for i in imgs if i["natural"] >= 1.6 * i["box"]]
    assert wide, f"losses.html has no multi-panel figure to check: {imgs}"
    for i in imgs:
        assert i["shown"] <= i["box"] + 1, f"a figure is wider than its column on a phone: {i}"
    assert page.locator(".figure-wide-hint").count() == len(wide)
    assert page.evaluate("document.documentElement.scrollWidth") <= 392, "the page pans sideways"
    page.locator(".cell-output-display img.zoomable").first.click()
    assert page.locator(".figure-zoom img").count() == 1, "a tap did not open the figure at full size"
    page.close()


def test_sidebar_opens_the_part_being_read(site, server, browser):
    """On a chapter the sidebar folds every Part but the one holding it, and shows the chapter's own entry; on the
    landing page (the map, in no Part) every Part is folded and the sidebar starts at its top. Chapter titles carry
    their numbers."""
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    # a chapter, and reference pages whose long contents list sits under the entry (the contents follower ran after
    # the entry was shown, and scrolled it away)
    for name in ("verl_cpu", "api_core", "api_envs", "api_tools"):
        page.goto(server + name + ".html")
        page.wait_for_load_state("load")
        page.wait_for_timeout(800)
        state = page.evaluate("""() => {
            const side = document.getElementById('quarto-sidebar'), here = side.querySelector('a.sidebar-link.active');
            const r = here.getBoundingClientRect(), b = side.getBoundingClientRect();
            return {open: [...side.querySelectorAll('ul.sidebar-section.depth1.show')].map(u => u.contains(here)),
                    visible: r.top >= b.top && r.bottom <= b.bottom, title: document.querySelector('h1').innerText};
        }""")
        assert state["open"] == [True], f"{name}: other Parts stay open, or the page's own is folded: {state}"
        assert state["visible"], f"{name}: the page's own entry is scrolled out of the sidebar"
    assert state["title"].startswith("API: tools"), state["title"]
    page.goto(server + "verl_cpu.html")
    assert page.evaluate("document.querySelector('h1').innerText").startswith("15 · ")
    page.goto(server + "index.html")
    page.wait_for_load_state("load")
    page.wait_for_timeout(300)
    first = page.evaluate("""() => { const side = document.getElementById('quarto-sidebar');
        const a = side.querySelector('a.sidebar-link'), r = a.getBoundingClientRect(), b = side.getBoundingClientRect();
        return {shown: r.top >= b.top && r.bottom <= b.bottom,
                open: side.querySelectorAll('ul.sidebar-section.depth1.show').length}; }""")
    assert first == {"shown": True, "open": 0}, f"the landing page's sidebar: {first}"
    page.close()
    # on a phone the sidebar is a drawer: it opens under the header and its breadcrumb bar, and fits the screen
    page = browser.new_page(viewport={"width": 390, "height": 844})
    page.goto(server + "verl.html")
    page.wait_for_load_state("load")
    page.locator(".quarto-btn-toggle").first.click()
    page.wait_for_timeout(400)
    box = page.evaluate("""() => { const s = document.getElementById('quarto-sidebar').getBoundingClientRect();
        return {top: s.top, bottom: s.bottom, bar: document.querySelector('.quarto-secondary-nav').getBoundingClientRect().bottom}; }""")
    assert box["top"] >= box["bar"] - 1 and box["bottom"] <= 844 + 1, f"the phone drawer: {box}"
    page.close()


def test_wide_tables_say_they_scroll_on_a_phone(site, server, browser):
    """A Markdown table wider than a phone's column scrolls inside its box, with a shadow on the hidden edge (drawn
    over the table's opaque cells) and a line under it that says so."""
    page = browser.new_page(viewport={"width": 390, "height": 844})
    page.goto(server + "mdp.html")
    page.wait_for_load_state("load")
    wraps = page.evaluate("""() => [...document.querySelectorAll('main .scroll-wrap')].map(w => ({
        more: w.firstElementChild.scrollWidth > w.firstElementChild.clientWidth + 2,
        cue: w.classList.contains('overflows-right'),
        hint: !!(w.nextElementSibling && w.nextElementSibling.classList.contains('table-wide-hint'))}))""")
    wide = [w for w in wraps if w["more"]]
    assert wide and all(w["cue"] and w["hint"] for w in wide), wraps
    page.close()


def test_chapter_mentions_link_to_their_chapters(site):
    """'chapter 13' in prose links to chapter 13's page; code, maths, headings, links and HTML blocks are left alone,
    a page does not link to itself, and no Markdown link leaks into a page as text."""
    sys.path.insert(0, str(ROOT / "scripts"))
    import build_docs
    pages = {"10": "trainer.ipynb", "11": "speedrun.ipynb", "12": "verl.ipynb", "00a": "tinylm.ipynb"}
    link = build_docs.link_chapter_mentions
    assert link("as chapter 10 shows", pages) == "as [chapter 10](trainer.ipynb) shows"
    assert link("chapters 10 and 11", pages) == "[chapters 10](trainer.ipynb) and [11](speedrun.ipynb)"
    assert link("chapters 12 and 10", pages, own="verl.ipynb") == "chapters 12 and [10](trainer.ipynb)"
    assert link("chapter 00a's model", pages) == "[chapter 00a](tinylm.ipynb)'s model"
    for kept in ("`chapter 10`", "[chapter 10](x.ipynb)", "## Chapter 10", "$chapter 10$", "chapter 99", "chapter 101",
                 "<div>\nchapter 10\n</div>", "```\nchapter 10\n```"):
        assert link(kept, pages) == kept, kept
    verl = (site / "verl.html").read_text()
    assert '<a href="verl_data.html">chapter 13</a>' in verl
    leaked = [p.name for p in site.glob("*.html") if re.search(r"\]\([\w.-]+\.ipynb\)", p.read_text())]
    assert not leaked, f"Markdown links shown as text on {leaked}"

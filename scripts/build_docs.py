#!/usr/bin/env python3
"""Build the docs site offline from the notebooks, and README.md from nbs/index.ipynb.

The project keeps nbdev's own Quarto configuration (nbs/_quarto.yml, sidebar.yml), so `nbdev-docs` builds it
wherever Quarto is installed. Quarto cannot be installed on our machines, so this script renders the same project
with smalldocs, a pure-Python renderer of `_quarto.yml` projects:

1. nbdev processes the notebooks into _proc/ (what `nbdev-proc-nbs` does, minus its attempt to install Quarto
   with sudo): directives applied, hidden cells dropped, `show_doc` cells executed into API reference, and
   backticked names linked;
2. the processed notebooks are given the page names Quarto would give them (nbdev's `output-file`, e.g.
   00_core.ipynb -> core.html), so that nbdev's doc links resolve;
3. smalldocs renders the site; any warning other than the known "Quarto-only key" notes fails the build
   (a broken link is such a warning); nbdev links a private name to `#_name` where the API entry's anchor is
   `#name`, so those links are pointed at the entry, and a private name with no entry is not linked;
4. KaTeX is bundled into the site (smalldocs links it from a CDN), and the theme's import of Google Fonts is
   dropped (the theme's own fallback font stack applies), so that the site loads nothing from the network.

usage: python scripts/build_docs.py [--out DIR] [--readme | --check-readme] [--serve [PORT]]
"""
from __future__ import annotations

import argparse
import http.server
import json
import os
import re
import shutil
import subprocess
import sys
from functools import partial
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# smalldocs notes about keys that only Quarto reads; expected, since the config is nbdev's Quarto config
EXPECTED_WARNINGS = (
    re.compile(r"unknown key format-links"),
    re.compile(r"format commonmark is not built"),
    re.compile(r"format\.html\.(keep-md|html-math-method) is ignored"),
    re.compile(r"output-file is not read by smalldocs"),
)


class BuildError(RuntimeError):
    pass


def _frontmatter(nb: dict) -> dict:
    "The YAML frontmatter nbdev puts in the first raw cell of a processed notebook."
    import yaml

    if not nb["cells"] or nb["cells"][0]["cell_type"] != "raw":
        return {}
    src = "".join(nb["cells"][0]["source"]).strip()
    return yaml.safe_load(src.strip("-")) or {} if src.startswith("---") else {}


def _default_exp(nb_path: Path) -> str | None:
    "The module a notebook exports (its `#| default_exp`), or None."
    for cell in json.loads(nb_path.read_text())["cells"]:
        m = re.search(r"^#\|\s*default_exp\s+(\S+)", "".join(cell["source"]), re.M)
        if cell["cell_type"] == "code" and m:
            return m.group(1)
    return None


def process_notebooks() -> Path:
    "Run nbdev's notebook processing into _proc/ and return it."
    os.chdir(ROOT)
    from nbdev.config import get_config
    from nbdev.quarto import refresh_quarto_yml
    from nbdev.serve import proc_nbs

    cfg = get_config()
    refresh_quarto_yml()  # writes nbs/nbdev.yml (title, description, output dir) from pyproject.toml
    proc = ROOT / "_proc"
    if proc.exists():
        shutil.rmtree(proc)
    # show_doc's links come from the committed _modidx.py; the tests check it is what nbdev-export makes
    try:
        proc_nbs(path=str(cfg.nbs_path), force=True)
    except Exception as e:  # nbdev runs show_doc and import cells; say which notebook and cell failed
        raise BuildError(f"processing the notebooks failed: {str(e)[-2000:]}") from None
    return proc


def stage_pages(proc: Path, git_url: str) -> dict[str, str]:
    "Rename processed notebooks to Quarto's page names and fix every reference to them; return the renames."
    renames = {}
    for nb_path in sorted(proc.glob("*.ipynb")):
        out = _frontmatter(json.loads(nb_path.read_text())).get("output-file")
        if out and Path(out).stem != nb_path.stem:
            renames[nb_path.name] = Path(out).stem + ".ipynb"
    for old, new in renames.items():
        if (proc / new).exists():
            raise BuildError(f"two notebooks would both become {new}: rename one of them")
        (proc / old).rename(proc / new)
    # a reference is the file name not preceded by a path character (so 00_core.ipynb, not x00_core.ipynb)
    pats = [(re.compile(r"(?<![\w./-])" + re.escape(o)), n) for o, n in renames.items()]
    for f in [*proc.glob("*.ipynb"), proc / "sidebar.yml"]:
        text = f.read_text()
        for pat, new in pats:
            text = pat.sub(new, text)
        if not git_url:
            # nbdev's "source" links need the repository's URL; with none configured they would point nowhere
            text = re.sub(r"\[source\]\(/?blob/[^)]*\)\{[^}]*\}(\\n)*", "", text)
        f.write_text(text)
    return renames


_CHAPTER_NB = re.compile(r"^(\d{2}[a-z]?)_")
# a chapter's number after "chapter(s)", and the numbers listed after it ("chapters 10 and 11", "chapters 12 to 15")
_CHAPTER_MENTION = re.compile(r"\b([Cc]hapters?)(\s+)(\d{2}[a-z]?\b(?:(?:,\s*|\s+and\s+|\s+or\s+|\s+to\s+|\s*–\s*)"
                              r"\d{2}[a-z]?\b)*)")
# what a link must not go inside: code, links, HTML tags, maths
_NOT_PROSE = re.compile(r"(```.*?```|`[^`\n]*`|!?\[[^\]\n]*\]\([^)\n]*\)|<[^>\n]+>|\$\$.*?\$\$|\$[^$\n]+\$)", re.S)


def chapter_pages(renames: dict[str, str]) -> dict[str, str]:
    "Chapter number -> processed page (`12` -> `verl.ipynb`), from the notebooks' file names."
    pages = {}
    for nb in sorted((ROOT / "nbs").glob("*.ipynb")):
        if m := _CHAPTER_NB.match(nb.name):
            pages[m.group(1)] = renames.get(nb.name, nb.name)
    return pages


def link_chapter_mentions(text: str, pages: dict[str, str], own: str = "") -> str:
    """Link every "chapter 12" in Markdown prose to that chapter's page (headings, code, links and maths untouched):
    a reader meets chapters by number far more often than by title."""
    def numbers(m):
        out = m.group(1) + m.group(2)
        for i, part in enumerate(re.split(r"(\d{2}[a-z]?\b)", m.group(3))):
            page = pages.get(part) if i % 2 else None
            if not page or page == own:
                out += part
            else:  # the first number's link takes the word "chapter" with it
                out = f"[{out}{part}]({page})" if i == 1 else f"{out}[{part}]({page})"
        return out
    out, fence, block, prev_blank = [], False, False, True
    for line in text.split("\n"):
        s = line.strip()
        if s.startswith(("```", "~~~", "$$")):  # a code fence or display maths opens or closes
            fence = not fence if not (s.startswith("$$") and s.endswith("$$") and len(s) > 2) else fence
        elif not fence:
            block = (block or (prev_blank and s.startswith("<"))) and bool(s)  # an HTML block runs to a blank line
            if not block and not s.startswith("#"):
                line = "".join(p if i % 2 else _CHAPTER_MENTION.sub(numbers, p)
                               for i, p in enumerate(_NOT_PROSE.split(line)))
        prev_blank = not s
        out.append(line)
    return "\n".join(out)


def number_chapters(proc: Path, renames: dict[str, str]) -> int:
    """Put each chapter's number in its title (so in the page's heading and the sidebar) and link the chapters its
    prose mentions by number; returns the links made."""
    import yaml

    pages = chapter_pages(renames)
    made = 0
    for num, page in pages.items():
        path = proc / page
        nb = json.loads(path.read_text())
        front = _frontmatter(nb)
        if front.get("title"):
            front["title"] = f"{num} · {front['title']}"
            nb["cells"][0]["source"] = "---\n" + yaml.safe_dump(front, allow_unicode=True, width=10**6) + "---\n"
        for cell in nb["cells"]:
            if cell["cell_type"] == "markdown":
                src = "".join(cell["source"])
                new = link_chapter_mentions(src, pages, own=page)
                made += new.count("](") - src.count("](")
                cell["source"] = new
        path.write_text(json.dumps(nb, ensure_ascii=False))
    side = proc / "sidebar.yml"
    data = yaml.safe_load(side.read_text())
    number = {page: num for num, page in pages.items()}
    def walk(items):
        for item in items:
            if isinstance(item, dict) and "contents" in item:
                walk(item["contents"])
            elif isinstance(item, dict) and item.get("href") in number and "text" in item:
                item["text"] = f"{number[item['href']]} · {item['text']}"
    walk(data["website"]["sidebar"]["contents"])
    side.write_text(yaml.safe_dump(data, sort_keys=False, allow_unicode=True))
    for log in proc.glob("*_log.md"):
        text = log.read_text(encoding="utf-8")
        new = link_chapter_mentions(text, pages)
        made += new.count("](") - text.count("](")
        log.write_text(new, encoding="utf-8")
    return made


_SHOW_DOC = re.compile(r"^(?:#\|.*\n)*\s*show_doc\(", re.M)
_ENTRY_HEADING = re.compile(r"^#{2,4} +(.+?) *$", re.M)
_FOLD = re.compile(r'^#\| code-summary: "Exported source"$', re.M)


def _markdown_output(cell: dict) -> str:
    for out in cell.get("outputs", []):
        md = (out.get("data") or {}).get("text/markdown")
        if md:
            return "".join(md) if isinstance(md, list) else md
    return ""


def _api_entry(cell: dict) -> str | None:
    "The name an API entry documents (the heading of a `show_doc` cell's output), or None for any other cell."
    if cell["cell_type"] != "code" or not _SHOW_DOC.match("".join(cell["source"])):
        return None
    m = _ENTRY_HEADING.search(_markdown_output(cell))
    return m.group(1).strip("`") if m else None


def _cell(kind: str, source: str) -> dict:
    cell = {"cell_type": kind, "metadata": {}, "source": source}
    if kind == "code":
        cell.update(outputs=[], execution_count=None)
    return cell


def _raw_html(html: str) -> dict:
    return _cell("markdown", f"```{{=html}}\n{html}\n```")


def _module_source(module: str) -> str:
    "A generated module's source as a reader wants it: without the generator's header and cell markers."
    import importlib

    text = Path(importlib.import_module(module).__file__).read_text()
    text = re.sub(r"^# %% .*\n", "", text, flags=re.M)
    text = re.sub(r"^# AUTOGENERATED.*\n(# file to edit:.*\n)?", "", text)
    return re.sub(r"\n{3,}", "\n\n\n", text).strip() + "\n"


def _entry_source(module: str, name: str) -> str | None:
    "The source of `name` (possibly `Class.method`) in `module`, or None where Python cannot find it."
    import importlib
    import inspect

    obj = importlib.import_module(module)
    try:
        for part in name.split("."):
            obj = getattr(obj, part)
        obj = getattr(obj, "fget", obj)  # a property: its getter
        return inspect.getsource(obj).rstrip() + "\n"
    except (AttributeError, TypeError, OSError):
        return None


def split_reference(proc: Path, modules: dict[str, str]) -> dict[str, int]:
    """Move every API entry (a `show_doc` output) out of its chapter into the module's reference page.

    A chapter teaches in prose and code; the signature-and-parameter tables of its module go to a page of their own,
    `api_<page>.html`, with each entry's source folded under it and the whole module's source at the end. In the
    chapter each entry leaves an anchor at its place (so links to `page.html#name` still land where the chapter
    explains the name) and the chapter gains one line pointing at its reference. `modules` maps a chapter's notebook
    name in `proc` to its module. Returns the number of entries moved per reference page."""
    import yaml
    from smalldocs.markdown import pandoc_id

    moved = {}
    for page, module in modules.items():
        path = proc / page
        nb = json.loads(path.read_text())
        cells, entries = [], []
        for cell in nb["cells"]:
            name = _api_entry(cell)
            if name is None:
                if cell["cell_type"] == "code":  # a teaching cell's source (`#| exports`): say which module it is
                    cell["source"] = _FOLD.sub(f'#| code-summary: "{module}"', "".join(cell["source"]))
                cells.append(cell)
                continue
            anchor = pandoc_id(name)
            entries.append((name, anchor, cell))
            cells.append(_raw_html(f'<span id="{anchor}" class="api-anchor"></span>'))
        if not entries:
            continue
        stem = Path(page).stem
        ref = f"api_{stem}"
        chapter_title = _frontmatter(nb).get("title", stem)
        n = len(entries)
        pointer = _cell("markdown", f"::: {{.api-pointer}}\nThe reference for this chapter's module, `{module}`: "
                                    f"[{n} {'entry' if n == 1 else 'entries'} with signatures, parameters and "
                                    f"source]({ref}.html).\n:::")
        at = 2 if len(cells) > 2 and cells[0]["cell_type"] == "raw" else 0  # after the front matter and the warning
        cells.insert(at, pointer)
        nb["cells"] = cells
        path.write_text(json.dumps(nb, indent=1))

        front = {"title": f"API: {stem}", "description": f"The API of {module}: every public function and class, "
                                                     f"its parameters and its source"}
        body = [_cell("raw", f"---\n{yaml.safe_dump(front, allow_unicode=True, width=10**6)}---\n"),
                _cell("markdown", f"Entries in the order the chapter [{chapter_title}]({page}) introduces them. "
                                  f"Each has its source folded under it, and a link to where the chapter explains "
                                  f"it; the whole module's source is at the end.")]
        for name, anchor, cell in entries:
            body.append(cell)
            src = _entry_source(module, name)
            if src:
                body.append(_cell("code", f'#| code-fold: true\n#| code-summary: "Source"\n{src}'))
            body.append(_cell("markdown", f"[Where the chapter explains it]({page}#{anchor})"))
        body.append(_cell("markdown", f"## The whole module\n\n`{module.replace('.', '/')}.py`, as the notebook "
                                      f"exports it."))
        body.append(_cell("code", f'#| code-fold: true\n#| code-summary: "{module}"\n{_module_source(module)}'))
        (proc / f"{ref}.ipynb").write_text(json.dumps({**nb, "cells": body}, indent=1))
        moved[f"{ref}.ipynb"] = n
    return moved


# the development logs of the saved runs: what was tried and measured before the chapters' defaults were chosen
LOGS = {"speedrun_log": ROOT / "docs" / "speedrun" / "LOG.md", "gamerun_log": ROOT / "docs" / "gamerun" / "LOG.md"}


def stage_logs(proc: Path) -> list[str]:
    "Give each development log a page of its own (its first heading becomes the page's title); their file names."
    import yaml

    pages = []
    for stem, src in LOGS.items():
        text = src.read_text(encoding="utf-8")
        m = re.match(r"#\s+(.+)\n", text)
        if not m:
            raise BuildError(f"{src} must open with a '# title' line")
        front = {"title": m.group(1).strip(), "description": "What was run and measured while the chapter's "
                                                            "defaults were chosen"}
        body = text[m.end():]
        for img in sorted(set(re.findall(r"!\[[^\]]*\]\(([^)\s]+\.png)\)", body))):  # its figures go beside the page
            if not (src.parent / img).is_file():
                raise BuildError(f"{src} shows {img}, which is not in {src.parent}")
            flat = f"{stem}_{img.replace('/', '_')}"
            shutil.copy(src.parent / img, proc / flat)
            body = body.replace(f"]({img})", f"]({flat})")
        (proc / f"{stem}.md").write_text(f"---\n{yaml.safe_dump(front, allow_unicode=True, width=10**6)}---\n\n"
                                         + body, encoding="utf-8")
        pages.append(f"{stem}.md")
    return pages


def add_to_sidebar(proc: Path, section: str, pages: list[str]):
    "List extra pages (the reference, the logs) in a section of their own at the end of the sidebar."
    import yaml

    path = proc / "sidebar.yml"
    data = yaml.safe_load(path.read_text())
    data["website"]["sidebar"]["contents"].append({"section": section, "contents": pages})
    path.write_text(yaml.safe_dump(data, sort_keys=False, allow_unicode=True))


REFERENCE_SECTION = "Reference (API)"


# a sidebar section (a Part, the logs, the reference): its two expanded toggles, then its list of pages
_SECTION = re.compile(r'(<a class="sidebar-item-text[^"]*"[^>]*aria-expanded=")true("[^>]*><span class="menu-text">'
                      r'[^<]*</span></a><a class="sidebar-item-toggle[^"]*)("[^>]*aria-expanded=")true("[^>]*>.*?'
                      r'</a></div><ul id="[^"]+" class="[^"]*?) show(">.*?</ul>)', re.S)


def fold_other_sections(out: Path) -> int:
    """Fold every sidebar section but the one that holds the page, so that the sidebar fits the screen and shows
    where the reader is (the landing page, in no section, folds them all); returns the sections folded."""
    folded = 0
    def fold(m):
        nonlocal folded
        if 'aria-current="page"' in m.group(5):
            return m.group(0)
        folded += 1
        return f'{m.group(1)}false{m.group(2)} collapsed{m.group(3)}false{m.group(4)}{m.group(5)}'
    for page in out.glob("*.html"):
        text = page.read_text(encoding="utf-8")
        new = _SECTION.sub(fold, text)
        if new != text:
            page.write_text(new, encoding="utf-8")
    return folded


def render(proc: Path, out: Path) -> list[str]:
    "Render _proc/ with smalldocs into `out`; fail on any unexpected warning. Returns the expected notes."
    exe = Path(sys.executable).with_name("smalldocs")
    cmd = [str(exe) if exe.exists() else "smalldocs", "render", "-q", str(proc)]
    res = subprocess.run(cmd, capture_output=True, text=True)
    lines = [l for l in (res.stdout + res.stderr).splitlines() if l.strip()]
    notes = [l for l in lines if any(p.search(l) for p in EXPECTED_WARNINGS)]
    problems = [l for l in lines if l not in notes and not l.startswith("wrote ")]
    if res.returncode != 0 or problems:
        raise BuildError("smalldocs render failed:\n  " + "\n  ".join(problems or lines))
    built = proc / "_docs"
    if out.exists():
        shutil.rmtree(out)
    shutil.move(str(built), str(out))
    return notes


def katex_dist() -> Path:
    "Where scripts/setup.sh put KaTeX (the version smalldocs links to)."
    from smalldocs.layout import KATEX

    version = KATEX.split("katex@")[1].split("/")[0]
    venv = Path(os.environ.get("AR1_VENV", ROOT / ".venv"))
    dist = venv / "npm" / "node_modules" / "katex" / "dist"
    pkg = dist.parent / "package.json"
    if not (dist / "katex.min.js").exists() or json.loads(pkg.read_text())["version"] != version:
        raise BuildError(f"KaTeX {version} is not in {dist}; run `bash scripts/setup.sh dev` to fetch it")
    return dist


def bundle_katex(out: Path) -> int:
    "Copy KaTeX into the site and point every page at it instead of the CDN; return the pages changed."
    from smalldocs.layout import KATEX

    dist = katex_dist()
    dest = out / "site_libs" / "katex"
    dest.mkdir(parents=True, exist_ok=True)
    for name in ("katex.min.css", "katex.min.js"):
        shutil.copy2(dist / name, dest / name)
    for sub in ("contrib", "fonts"):
        shutil.copytree(dist / sub, dest / sub, dirs_exist_ok=True)
    changed = 0
    for page in out.rglob("*.html"):
        text = page.read_text()
        if KATEX in text:
            rel = os.path.relpath(dest, page.parent).replace(os.sep, "/")
            page.write_text(text.replace(KATEX, rel))
            changed += 1
    return changed


_REMOTE_IMPORT = re.compile(r"@import\s+url\((['\"]?)(?:https?:)?//[^)]*\1\)\s*;?")


def drop_remote_css_imports(out: Path) -> list[str]:
    "Remove `@import url(https://...)` (the theme's web fonts) from the site's stylesheets; return what was removed."
    removed = []
    for css in out.rglob("*.css"):
        text = css.read_text()
        found = _REMOTE_IMPORT.findall(text)
        if found:
            removed += [m.group(0)[:80] for m in _REMOTE_IMPORT.finditer(text)]
            css.write_text(_REMOTE_IMPORT.sub("", text))
    return removed


_EXTERNAL_ASSET = re.compile(r"""<(?:script|link|img|iframe)\b[^>]*\b(?:src|href)=["'](?:https?:)?//""", re.I)
_EXTERNAL_CSS = re.compile(r"""(@import|url\()\s*['"]?(?:https?:)?//""", re.I)


def check_offline(out: Path):
    "Fail if any page or stylesheet still loads a script, stylesheet, font, image or frame from the network."
    bad = [str(p.relative_to(out)) for p in out.rglob("*.html") if _EXTERNAL_ASSET.search(p.read_text())]
    bad += [str(p.relative_to(out)) for p in out.rglob("*.css") if _EXTERNAL_CSS.search(p.read_text())]
    if bad:
        raise BuildError(f"these files load assets from the network: {', '.join(bad)}")


def readme_text() -> str:
    "README.md as made from nbs/index.ipynb: its non-hidden cells, links to chapters pointed at nbs/."
    import nbformat
    from nbconvert import MarkdownExporter

    nb = nbformat.read(ROOT / "nbs" / "index.ipynb", as_version=4)
    keep = []
    for cell in nb.cells:
        directives = [l for l in cell.source.splitlines() if l.startswith("#|")]
        if any(re.match(r"#\|\s*(hide|export|exporti|exports|default_exp|eval:\s*false)\b", d) for d in directives):
            continue
        if any(re.match(r"#\|\s*echo:\s*false", d) for d in directives):  # its outputs only, as on the site
            parts = []
            for out in cell.get("outputs", []):
                if out.get("output_type") == "stream":
                    parts.append("```\n" + "".join(out["text"]).rstrip() + "\n```")
                elif "text/markdown" in out.get("data", {}):
                    parts.append("".join(out["data"]["text/markdown"]))
            keep.append(nbformat.v4.new_markdown_cell("\n\n".join(parts)))
            continue
        if cell.cell_type == "code":
            cell.source = "\n".join(l for l in cell.source.splitlines() if not l.startswith("#|"))
        keep.append(cell)
    nb.cells = keep
    body, _ = MarkdownExporter().from_notebook_node(nb)
    # chapter links are relative to nbs/ in the notebook; README.md sits at the root
    body = re.sub(r"\]\((?!https?:|#|/)([^)\s]+\.ipynb)", r"](nbs/\1", body)
    header = "<!-- Generated from nbs/index.ipynb by scripts/build_docs.py --readme; edit the notebook. -->\n\n"
    return header + re.sub(r"\n{3,}", "\n\n", body).strip() + "\n"


_ID = re.compile(r'\sid="([^"]+)"')
_PRIVATE_LINK = re.compile(r'<a href="([\w.-]+\.html)#_([\w.]+)"([^>]*)>(.*?)</a>', re.S)


def fix_private_anchors(out: Path) -> int:
    "nbdev links private names (`#_name`): point each at its API entry (`#name`) or, with none, unlink it; how many."
    ids = {page.name: set(_ID.findall(page.read_text(encoding="utf-8"))) for page in out.glob("*.html")}
    fixed = 0
    for page in out.glob("*.html"):
        text = page.read_text(encoding="utf-8")

        def sub(m):
            nonlocal fixed
            target, name, attrs, inner = m.groups()
            have = ids.get(target, set())
            if f"_{name}" in have:
                return m.group(0)
            fixed += 1
            if name in have and target == page.name:  # a helper documented on its own page
                return f'<a href="{target}#{name}"{attrs}>{inner}</a>'
            # a helper without an entry of its own, or one nbdev matched by name in another module: no link
            return inner

        new = _PRIVATE_LINK.sub(sub, text)
        if new != text:
            page.write_text(new, encoding="utf-8")
    return fixed


def write_favicon(out: Path):
    "A small icon for the browser tab (browsers ask for /favicon.ico on every page; without one they log a 404)."
    from PIL import Image, ImageDraw

    img = Image.new("RGBA", (32, 32), (44, 123, 229, 255))
    ImageDraw.Draw(img).rectangle([8, 8, 23, 23], outline=(255, 255, 255, 255), width=3)
    img.save(out / "favicon.ico", sizes=[(32, 32), (16, 16)])


def build(out: Path) -> dict:
    "The whole build; returns a summary."
    from nbdev.config import get_config

    git_url = get_config().git_url
    proc = process_notebooks()
    renames = stage_pages(proc, git_url)
    modules = {renames.get(nb.name, nb.name): f"{get_config().lib_name}.{exp}"
               for nb in sorted((ROOT / "nbs").glob("*.ipynb")) if (exp := _default_exp(nb))}
    reference = split_reference(proc, modules)
    logs = stage_logs(proc)
    links = number_chapters(proc, renames)
    add_to_sidebar(proc, "Development logs", logs)
    add_to_sidebar(proc, REFERENCE_SECTION, sorted(reference))
    notes = render(proc, out)
    fix_private_anchors(out)
    folded = fold_other_sections(out)
    write_favicon(out)
    pages = bundle_katex(out)
    dropped = drop_remote_css_imports(out)
    check_offline(out)
    return {"out": str(out), "pages": sorted(p.name for p in out.glob("*.html")), "renamed": renames,
            "api_entries": sum(reference.values()),
            "katex_pages": pages, "remote_css_imports_dropped": len(dropped),
            "quarto_only_notes": len(notes), "chapter_links": links,
            "sidebar_sections_folded": folded}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=str(ROOT / "_docs"), help="where to write the site (default _docs)")
    g = ap.add_mutually_exclusive_group()
    g.add_argument("--readme", action="store_true", help="also write README.md from nbs/index.ipynb")
    g.add_argument("--check-readme", action="store_true", help="only check that README.md is up to date")
    ap.add_argument("--serve", nargs="?", const=8000, type=int, metavar="PORT", help="serve the site afterwards")
    args = ap.parse_args(argv)
    try:
        if args.check_readme:
            if (ROOT / "README.md").read_text() != readme_text():
                sys.exit("README.md is out of date with nbs/index.ipynb: run `bash scripts/docs.sh`")
            print("README.md is up to date")
            return
        summary = build(Path(args.out).resolve())
    except BuildError as e:
        sys.exit(f"docs build failed: {e}")
    if args.readme:
        (ROOT / "README.md").write_text(readme_text())
        summary["readme"] = "README.md"
    print(json.dumps(summary, indent=1))
    if args.serve:
        handler = partial(http.server.SimpleHTTPRequestHandler, directory=summary["out"])
        with http.server.ThreadingHTTPServer(("127.0.0.1", args.serve), handler) as srv:
            print(f"serving {summary['out']} on http://127.0.0.1:{args.serve} (Ctrl-C stops)")
            try:
                srv.serve_forever()
            except KeyboardInterrupt:
                pass


if __name__ == "__main__":
    main()

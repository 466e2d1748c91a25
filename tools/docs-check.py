#!/usr/bin/env python3
"""Checks a built documentation site (mkdocs build): every internal link and anchor of every
page resolves, and every page loads in headless Chromium with its content rendered.

    tools/docs-check.py SITE_DIR [--shots DIR] [--chromium PROGRAM]

Links: every href and src of every HTML page that is not external (http:, https:, mailto:,
data:) must name a file of the site, and a #fragment an id of that page. Pages: Chromium
opens each page from the file system (--dump-dom); a page passes when the rendered DOM holds
its <h1> inside the theme's content area. --shots DIR also writes a
PNG screenshot of each page there. Exits 1 naming every failure.
"""
import argparse
import concurrent.futures
import html.parser
import pathlib
import shutil
import subprocess
import sys
import urllib.parse


class Page(html.parser.HTMLParser):
    def __init__(self):
        super().__init__()
        self.links, self.ids = [], set()

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if a.get("id"):
            self.ids.add(a["id"])
        if tag == "a" and a.get("name"):
            self.ids.add(a["name"])
        for key in ("href", "src"):
            if a.get(key) is not None:
                self.links.append((tag, a[key]))


def parse(path):
    p = Page()
    p.feed(path.read_text(encoding="utf-8"))
    return p


def check_links(site):
    pages = {p: parse(p) for p in site.rglob("*.html")}
    errors = []
    for path, page in pages.items():
        if path.name == "404.html":
            continue  # served for any missing URL, so its links are absolute from the site root
        for tag, link in page.links:
            u = urllib.parse.urlsplit(link)
            if u.scheme or link.startswith("//"):
                continue  # external: not ours to check
            target = (path.parent / urllib.parse.unquote(u.path)).resolve() if u.path else path
            if target.is_dir():
                target = target / "index.html"
            rel = path.relative_to(site)
            if not target.exists():
                errors.append(f"{rel}: <{tag}> {link}: no such file")
                continue
            if u.fragment and target.suffix == ".html":
                ids = pages[target].ids if target in pages else parse(target).ids
                if urllib.parse.unquote(u.fragment) not in ids:
                    errors.append(f"{rel}: <{tag}> {link}: no anchor #{u.fragment}")
    return pages, errors


def load(chromium, path, shots):
    base = [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
            "--allow-file-access-from-files"]
    url = path.resolve().as_uri()
    r = subprocess.run(base + ["--dump-dom", url], capture_output=True, text=True, timeout=60)
    dom = r.stdout
    problems = []
    if r.returncode != 0:
        problems.append(f"chromium exited {r.returncode}: {r.stderr.strip()[-300:]}")
    if "<h1" not in dom:
        problems.append("no <h1> in the rendered page")
    if 'class="md-content"' not in dom:
        problems.append("the theme's page structure (md-content) is missing")
    if "ERR_" in dom[:2000] and "neterror" in dom:
        problems.append("Chromium showed its error page")
    if shots is not None:
        png = shots / (str(path.name).removesuffix(".html") + ".png")
        r = subprocess.run(base + ["--window-size=1280,1600", f"--screenshot={png}", url],
                           capture_output=True, text=True, timeout=60)
        if r.returncode != 0 or not png.exists():
            problems.append(f"no screenshot: {r.stderr.strip()[-300:]}")
    return path, problems


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("site")
    ap.add_argument("--shots")
    ap.add_argument("--chromium", default=shutil.which("chromium") or "chromium")
    args = ap.parse_args()
    site = pathlib.Path(args.site).resolve()
    pages, errors = check_links(site)
    shots = pathlib.Path(args.shots) if args.shots else None
    if shots:
        shots.mkdir(parents=True, exist_ok=True)
    content = sorted(p for p in pages if p.name != "404.html")
    with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
        for path, problems in pool.map(lambda p: load(args.chromium, p, shots), content):
            errors += [f"{path.relative_to(site)}: {m}" for m in problems]
    links = sum(len(p.links) for p in pages.values())
    print(f"docs-check: {len(pages)} pages, {links} links and sources checked, "
          f"{len(content)} pages opened in Chromium" + (f", screenshots in {shots}" if shots else ""))
    for e in errors:
        print("docs-check: " + e, file=sys.stderr)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())

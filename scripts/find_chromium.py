#!/usr/bin/env python3
"""Print the path of a Chromium (or Chrome) that runs headless here, or exit 1.

Looks at $AR1_CHROMIUM, then the usual names on PATH, then a Chromium that Playwright downloaded itself.
Standard library only, so that scripts/setup.sh can ask before anything is installed.
"""
from __future__ import annotations

import glob
import os
import shutil
import subprocess
import sys

NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable", "chrome")


def _runs(path: str) -> bool:
    try:
        return subprocess.run([path, "--version"], capture_output=True, timeout=30).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def find_chromium() -> str | None:
    "The first Chromium that answers `--version`, or None."
    cands = [os.environ.get("AR1_CHROMIUM", "")]
    cands += [shutil.which(n) or "" for n in NAMES]
    cache = os.environ.get("PLAYWRIGHT_BROWSERS_PATH") or os.path.expanduser("~/.cache/ms-playwright")
    cands += sorted(glob.glob(os.path.join(cache, "chromium-*", "chrome-*", "chrome")), reverse=True)
    return next((c for c in cands if c and os.path.isfile(c) and _runs(c)), None)


if __name__ == "__main__":
    path = find_chromium()
    if not path:
        sys.exit("no Chromium found: install one (Debian: apt-get install chromium) or set AR1_CHROMIUM")
    print(path)

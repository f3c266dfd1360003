"""Opening a page in Debian's headless chromium for the plot tests: the DOM after its
scripts ran, and chromium's stderr (where --enable-logging sends the console).

A plain module the tests import by name. The browser gets no network at all (every host
resolves to nothing), so a page that fetched anything would log a load error."""

from __future__ import annotations

import html
import json
import re
import shutil
import subprocess
import tempfile
from pathlib import Path


def chromium() -> str | None:
    """The chromium binary, or None where it is not installed."""
    return shutil.which("chromium") or shutil.which("chromium-browser")


def open_page(page: Path, fragment: str = "", timeout: int = 90) -> tuple[str, str]:
    """(the DOM once the page settled, chromium's stderr)."""
    with tempfile.TemporaryDirectory() as profile:
        url = page.resolve().as_uri() + (f"#{fragment}" if fragment else "")
        done = subprocess.run(
            [chromium(), "--headless", "--no-sandbox", "--disable-gpu",
             "--no-first-run", f"--user-data-dir={profile}", "--window-size=1400,1600",
             "--host-resolver-rules=MAP * ~NOTFOUND", "--virtual-time-budget=5000",
             "--enable-logging=stderr", "--v=0", "--dump-dom", url],
            capture_output=True, text=True, timeout=timeout)
    return done.stdout, done.stderr


def selftest_report(dom: str) -> dict | None:
    """What the page's #selftest hook wrote, or None if it wrote nothing."""
    found = re.search(r'<pre id="selftest">(.*?)</pre>', dom, re.S)
    if not found or not found.group(1).strip():
        return None
    return json.loads(html.unescape(found.group(1)))

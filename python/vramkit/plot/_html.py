"""The HTML page: the History and its Layout as JSON inside one self-contained file, with
page.js and page.css (package data) inlined, so the page opens offline and names nothing
outside itself.

Heights go into the page as integers in HEIGHT units of the tallest thing drawn, not bytes,
which keeps a long history's points short; the exact bytes travel only where the hover shows
them (each band's size, the merged band's most per bucket).
"""

from __future__ import annotations

import html
import json
import os
from pathlib import Path

HEIGHT = 10000
MAX_SEGMENTS = 500
MAX_SEGMENT_BLOCKS = 30000
STATES = ["active_allocated", "active_pending_free", "inactive", "merged"]

# Installed before anything else runs: errors and console.error calls are kept for the
# self-test, and an error that stops page.js itself still reaches #selftest.
_ERROR_HOOK = ("window.__vkErrors=[];function __vkKeep(m){window.__vkErrors.push(String(m));"
               "var p=document.getElementById('selftest');if(p&&/selftest=/.test(location.hash))"
               "p.textContent=JSON.stringify({errors:window.__vkErrors})}"
               "window.addEventListener('error',function(e){__vkKeep(e.message)});"
               "(function(){var f=console.error;console.error=function(){__vkKeep("
               "Array.prototype.join.call(arguments,' '));return f.apply(console,arguments)}})();")

_TEMPLATE = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<title>vramkit plot: {name}</title>
<script>{hook}</script>
<style>{css}</style></head><body>
<h1>Memory of {name}</h1>
<div class="facts" id="facts"></div>
<noscript>This page draws with JavaScript; allow it to see the picture.</noscript>
<div class="notes" id="notes" style="display:none"><b>Not in the picture, or drawn with a
caveat:</b><ul></ul></div>
<h2>Timeline: {drawn} memory by {band}, reserved above it</h2>
<div class="chart"><svg id="timeline" preserveAspectRatio="none"></svg></div>
<div class="legend">{band_legend}<span style="background:#b8b8b8"></span>small
or short-lived blocks, merged<span style="background:#1f4fbf;height:2px"></span>reserved
<span style="background:#d00;width:2px"></span>out of memory</div>
<h2>Segments at snapshot time</h2>
<div id="segments"></div>
<div id="tip"></div><pre id="selftest"></pre>
<script type="application/json" id="vk-data">{data}</script>
<script>{js}</script>
</body></html>
"""


# What one band is: an allocation, or in a memory log (which holds no blocks) a record's
# allocated bytes until the next record.
_BLOCK_LEGEND = ("each coloured band is one allocation (colour: its call site), oldest at\n"
                 "the bottom; hover for size, call site and lifetime")
_LOG_LEGEND = ("each coloured band is one record of the log: the bytes allocated at its step,\n"
               "until the next record; hover for its step")


def blocks_noun(history) -> str:
    """What the history's blocks are, for the counts the page and the PNG state."""
    return "records" if history.kind == "log" else "allocations"


def peak_label(history) -> str:
    """What the page's peak is. A trace records the sizes asked for, and the engine holds
    each rounded up (its allocated bytes), so a trace's peak is of the requested bytes."""
    return "peak live (requested)" if history.kind == "trace" else "peak allocated"


def _asset(name: str) -> str:
    return (Path(__file__).with_name(name)).read_text(encoding="utf-8")


def page_data(history, lay) -> dict:
    tallest = max(lay.small_top + (lay.reserved or []) + [1])
    unit = tallest * 1.05 / HEIGHT     # headroom, so a line at the peak stays visible
    sites: dict[str, int] = {}

    def site_index(site):
        if not site:
            return -1
        return sites.setdefault(site, len(sites))

    bands = []
    for block, first, end, points in lay.bands:
        pts = [v if j % 2 == 0 else round(v / unit) for j, v in enumerate(points)]
        bands.append([first, end, max(1, round(block.size / unit)), site_index(block.site),
                      block.size, round(block.start), -1 if block.end is None
                      else round(block.end), block.stream, pts])
    small = {"bottom": [round(v / unit) for v in lay.big_top],
             "top": [round(v / unit) for v in lay.small_top],
             "count": lay.small_count, "bytes": lay.small_max,
             "drawn": [a - b for a, b in zip(lay.small_top, lay.big_top)]}
    peak_reserved = max(max(v for _, v in history.reserved), history.stated_peak_reserved) \
        if history.reserved else None
    return {
        "kind": {"trace": "vramkit trace", "log": "memory log"}.get(history.kind,
                                                                    "memory snapshot"),
        "device": history.device, "timeUnit": history.time_unit,
        "span": round(history.end_time), "width": lay.width, "height": HEIGHT, "unit": unit,
        "peak": history.peak_allocated, "peakLabel": peak_label(history),
        "peakReserved": peak_reserved,
        "blockCount": len(history.blocks), "blocksNoun": blocks_noun(history),
        "merged": lay.merged,
        "bands": bands, "small": small,
        "reserved": None if lay.reserved is None else [round(v / unit) for v in lay.reserved],
        "reservedNote": history.reserved_note,
        "ooms": [[k, text] for k, text in lay.ooms],
        "notes": history.notes,
        "segments": _segments(history, site_index),
        "segmentsNote": history.segments_note, "states": STATES,
        "noSite": "a trace records no call sites" if history.kind == "trace"
                  else "recorded without stacks",
        "sites": list(sites),
    }


def _segments(history, site_index):
    """The segments, each block a [offset, size, requested, state, site, count] row; runs
    of blocks under a pixel of their segment are merged into one row (count > 1)."""
    if not history.segments:
        return None
    segments = history.segments
    if len(segments) > MAX_SEGMENTS:
        keep = sorted(segments, key=lambda s: s["size"], reverse=True)[:MAX_SEGMENTS]
        history.segments_note = (f"{len(segments) - MAX_SEGMENTS} smaller segments of "
                                 f"{len(segments)} are not shown")
        kept = {id(s) for s in keep}
        segments = [s for s in segments if id(s) in kept]
    budget = max(1, MAX_SEGMENT_BLOCKS // len(segments))
    out = []
    for seg in segments:
        tiny = max(seg["size"] / 2000, seg["size"] / budget)
        rows = []
        run = None
        for offset, size, requested, state, site in seg["blocks"]:
            code = STATES.index(state) if state in STATES[:3] else 2
            row = [offset, size, requested, code, site_index(site), 1]
            if size >= tiny:
                run = None
                rows.append(row)
            elif run is None:
                run = row
                rows.append(run)
            else:
                if run[5] == 1:   # a second tiny block: the run becomes a merged row
                    run[2:5] = [None, 3, -1]
                run[1] = offset + size - run[0]
                run[5] += 1
        address = None if seg["address"] is None else f"{seg['address']:x}"
        out.append({"a": address, "s": max(seg["size"], 1), "st": seg["stream"],
                    "ty": seg["type"], "b": rows})
    return out


def render(history, lay, output):
    data = json.dumps(page_data(history, lay), separators=(",", ":"))
    # Inside <script>, "</" could end the element early; \u003c is the same text to JSON.
    data = data.replace("<", "\\u003c")
    name = html.escape(os.path.basename(history.path))
    page = _TEMPLATE.format(name=name, hook=_ERROR_HOOK, css=_asset("page.css"), data=data,
                            js=_asset("page.js"),
                            drawn="requested" if history.kind == "trace" else "allocated",
                            band="record" if history.kind == "log" else "allocation",
                            band_legend=_LOG_LEGEND if history.kind == "log" else _BLOCK_LEGEND)
    with open(output, "w", encoding="utf-8") as f:
        f.write(page)

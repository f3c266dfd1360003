"""The PNG: the same timeline as the page (bands, the merged band, reserved, out-of-memory
points) drawn with matplotlib, which is optional (the `plot` extra) and imported only here."""

from __future__ import annotations

import os
import zlib


class MissingMatplotlib(Exception):
    """matplotlib is not installed; the message says how to get it."""


def render(history, lay, output):
    try:
        import matplotlib
    except ImportError:
        raise MissingMatplotlib("drawing a PNG needs matplotlib, which is not installed: "
                                "pip install 'vramkit[plot]'") from None
    matplotlib.use("Agg")  # a file, never a window: the command may run with no display
    import matplotlib.pyplot as plt
    from matplotlib.collections import PolyCollection

    width = lay.width
    span = history.end_time
    to_time = span / width
    gib = float(1 << 30)
    polygons = []
    colours = []
    for index, (block, first, end, points) in enumerate(lay.bands):
        bottom = []
        for j in range(0, len(points), 2):
            k, y = points[j], points[j + 1]
            k_next = points[j + 2] if j + 2 < len(points) else end
            bottom += [(k * to_time, y / gib), (k_next * to_time, y / gib)]
        top = [(x, y + block.size / gib) for x, y in reversed(bottom)]
        polygons.append(bottom + top)
        # A stable colour per call site (str hash changes per process); without call sites,
        # neighbours get different colours so that the bands stay apart.
        colours.append(f"C{(zlib.crc32(block.site.encode()) if block.site else index) % 10}")
    figure, axes = plt.subplots(figsize=(12, 5), dpi=100)
    axes.add_collection(PolyCollection(polygons, facecolors=colours, linewidths=0))
    xs = [k * to_time for k in range(width + 1)]
    small_bottom = [v / gib for v in lay.big_top]
    small_top = [v / gib for v in lay.small_top]
    if lay.merged:   # else the band is empty, and the legend would name what is not drawn
        axes.fill_between(xs[:-1], small_bottom, small_top, step="post", color="#b8b8b8",
                          linewidth=0, label="small or short-lived blocks, merged")
    tallest = max(small_top + [0])
    if lay.reserved is not None:
        reserved = [v / gib for v in lay.reserved]
        axes.step(xs[:-1], reserved, where="post", color="#1f4fbf", linewidth=1.2,
                  label="reserved")
        tallest = max([tallest] + reserved)
    for k, _ in lay.ooms:
        axes.axvline(k * to_time, color="#d00", linewidth=1.5)
    axes.set_xlim(0, span)
    axes.set_ylim(0, tallest * 1.05 or 1)
    axes.set_xlabel(f"time ({history.time_unit} from the first event)")
    axes.set_ylabel("GiB")
    from ._html import blocks_noun

    title = f"{os.path.basename(history.path)}: {len(lay.bands)} {blocks_noun(history)} as " \
            f"bands, {lay.merged} merged"
    if lay.reserved is None:
        title += "; reserved unknown"
    if lay.ooms:
        title += f"; {len(lay.ooms)} out of memory (red)"
    axes.set_title(title, fontsize=10)
    if axes.get_legend_handles_labels()[1]:   # an empty legend is a warning and a box
        axes.legend(loc="upper left", fontsize=8)
    figure.tight_layout()
    figure.savefig(output)
    plt.close(figure)

/* page.js - draws the page vramkit plot writes, from the JSON in #vk-data; inlined into the
 * page by _html.py, so it needs nothing from any network. The timeline is one SVG whose
 * user units are buckets (x) and the layout's height units (y), so each band is a path
 * built from its step points; hovering reads the element under the pointer. A page opened
 * with #selftest=SIZE hovers the band (and the segment block) of that size itself and writes
 * what it found into #selftest, for the browser test. */
(function () {
  "use strict";
  const D = JSON.parse(document.getElementById("vk-data").textContent);
  const NS = document.querySelector("svg").namespaceURI;  // the SVG namespace, no URL here
  const W = D.width, Y = D.height;
  const tip = document.getElementById("tip");

  function el(name, attrs, parent) {
    const node = document.createElementNS(NS, name);
    for (const k in attrs) node.setAttribute(k, attrs[k]);
    if (parent) parent.appendChild(node);
    return node;
  }
  function bytes(n) {
    if (n === null || n === undefined) return "?";
    const units = ["B", "KiB", "MiB", "GiB", "TiB"];
    let u = 0, v = n;
    // The unit of the figure as printed: one that rounds to 1024.0 is 1.00 of the next.
    while (u < units.length - 1 && (u ? Number(v.toFixed(1)) : v) >= 1024) { v /= 1024; u++; }
    return (u ? v.toFixed(v < 10 ? 2 : 1) : String(v)) + " " + units[u] +
           (u ? " (" + n + " bytes)" : "");
  }
  function time(t) {
    if (D.timeUnit !== "µs") return t + " " + D.timeUnit;
    if (t >= 1e6) return (t / 1e6).toFixed(3) + " s";
    if (t >= 1e3) return (t / 1e3).toFixed(3) + " ms";
    return t + " µs";
  }
  function color(site) {
    let h = 0;
    for (let i = 0; i < site.length; i++) h = (h * 31 + site.charCodeAt(i)) >>> 0;
    return "hsl(" + (h % 360) + ",55%," + (48 + (h >> 9) % 20) + "%)";
  }
  const siteName = (i) => (i < 0 ? "unknown (" + D.noSite + ")" : D.sites[i]);

  // ---- header and notes ----------------------------------------------------------------
  document.getElementById("facts").textContent =
    D.kind + (D.device === null ? "" : ", device " + D.device) +
    " · " + D.peakLabel + " " + bytes(D.peak) +
    " · peak reserved " + (D.peakReserved === null ? "unknown" : bytes(D.peakReserved)) +
    " · " + D.blockCount + " " + D.blocksNoun + ": " + D.bands.length + " drawn as bands, " +
    D.merged + " merged into the grey band of small and short-lived blocks" +
    " · " + D.ooms.length + " out-of-memory points";
  const notes = D.notes.slice();
  if (D.reservedNote) notes.push(D.reservedNote);
  if (notes.length) {
    const box = document.getElementById("notes");
    box.style.display = "block";
    for (const n of notes) {
      const li = document.createElement("li");
      li.textContent = n;
      box.querySelector("ul").appendChild(li);
    }
  }

  // ---- the timeline --------------------------------------------------------------------
  const svg = document.getElementById("timeline");
  svg.setAttribute("viewBox", "0 0 " + W + " " + Y);
  const chart = svg.parentNode;
  for (let i = 0; i <= 4; i++) {
    const y = i / 4;
    const g = document.createElement("div");
    g.className = "grid"; g.style.top = (100 * (1 - y)) + "%"; chart.appendChild(g);
    const l = document.createElement("div");
    l.className = "ylab"; l.style.top = (100 * (1 - y)) + "%";
    l.textContent = bytes(Math.round(y * Y * D.unit)).split(" (")[0];
    chart.appendChild(l);
  }
  for (let i = 0; i <= 5; i++) {
    const l = document.createElement("div");
    l.className = "xlab"; l.style.left = (20 * i) + "%";
    l.textContent = time(Math.round(D.span * i / 5));
    chart.appendChild(l);
  }
  D.bands.forEach(function (b, index) {
    const [k0, end, h, site, , , , , pts] = b;
    let d = "M" + k0 + " " + (Y - pts[1]);
    for (let j = 2; j < pts.length; j += 2) d += "H" + pts[j] + "V" + (Y - pts[j + 1]);
    d += "H" + end + "V" + (Y - pts[pts.length - 1] - h);
    for (let j = pts.length - 2; j >= 2; j -= 2) d += "H" + pts[j] + "V" + (Y - pts[j - 1] - h);
    d += "H" + k0 + "Z";
    // Without call sites every band would share one colour; tell neighbours apart instead.
    const fill = site < 0 ? "hsl(" + (index * 137.508) % 360 + ",50%,60%)" : color(D.sites[site]);
    el("path", {d: d, class: "band", fill: fill, "data-i": index}, svg);
  });
  if (D.small.top.some((v) => v > 0)) {
    let d = "M0 " + (Y - D.small.bottom[0]);
    for (let k = 0; k < W; k++) d += "H" + k + "V" + (Y - D.small.bottom[k]) + "H" + (k + 1);
    for (let k = W - 1; k >= 0; k--) d += "V" + (Y - D.small.top[k]) + "H" + k;
    el("path", {d: d + "Z", class: "small"}, svg);
  }
  if (D.reserved) {
    let d = "M0 " + (Y - D.reserved[0]);
    for (let k = 0; k < W; k++) d += "V" + (Y - D.reserved[k]) + "H" + (k + 1);
    el("path", {d: d, class: "reserved", "vector-effect": "non-scaling-stroke"}, svg);
  }
  D.ooms.forEach(function (o, index) {
    el("line", {x1: o[0] + 0.5, x2: o[0] + 0.5, y1: 0, y2: Y, class: "oom", "data-o": index,
                "vector-effect": "non-scaling-stroke"}, svg);
  });

  // ---- hover ---------------------------------------------------------------------------
  function bucketAt(event, node) {
    const r = node.getBoundingClientRect();
    return Math.max(0, Math.min(W - 1, Math.floor((event.clientX - r.left) / r.width * W)));
  }
  function describe(target, event) {
    if (target.classList.contains("band")) {
      const b = D.bands[+target.getAttribute("data-i")];
      const [, , , site, size, start, stop, stream] = b;
      return "size " + bytes(size) + "\ncall site " + siteName(site) +
        "\nlifetime " + time(start) + " to " +
        (stop < 0 ? "the end (still allocated)" : time(stop) + " (" + time(stop - start) + ")") +
        "\nstream " + stream;
    }
    if (target.classList.contains("small")) {
      const k = bucketAt(event, svg);
      return D.small.count[k] + " small or short-lived blocks merged here" +
        "\nat most " + bytes(D.small.bytes[k]) + " live at once" +
        (D.small.drawn[k] < D.small.bytes[k] ? "\ndrawn " + bytes(D.small.drawn[k]) +
          " tall: no more was live at once here above the bands" : "") +
        "\nbetween " + time(Math.round(k * D.span / W)) + " and " +
        time(Math.round((k + 1) * D.span / W));
    }
    if (target.classList.contains("oom")) return D.ooms[+target.getAttribute("data-o")][1];
    if (target.classList.contains("segblock")) {
      const s = D.segments[+target.getAttribute("data-s")];
      const b = s.b[+target.getAttribute("data-b")];
      const [offset, size, requested, state, site, count] = b;
      if (count > 1) return count + " blocks too small to draw one by one, " + bytes(size) +
        "\nat offset " + offset + " of segment " + s.a;
      return "block " + hex(s.a, offset) + "\nsize " + bytes(size) +
        (requested === null ? "" : "\nrequested " + bytes(requested)) +
        "\nstate " + D.states[state] + "\ncall site " + siteName(site);
    }
    return null;
  }
  function hex(base, offset) {
    if (base === null) return "at offset " + offset;
    return "0x" + (BigInt("0x" + base) + BigInt(offset)).toString(16);
  }
  function hover(event) {
    const text = describe(event.target, event);
    if (text === null) { tip.style.display = "none"; return; }
    tip.textContent = text;
    tip.style.display = "block";
    tip.style.left = (event.clientX + 14) + "px";
    tip.style.top = (event.clientY + 14) + "px";
  }
  document.addEventListener("mousemove", hover);

  // ---- the segments view ---------------------------------------------------------------
  const segs = document.getElementById("segments");
  if (!D.segments) {
    segs.innerHTML = "";
    const p = document.createElement("p");
    p.className = "missing"; p.textContent = D.segmentsNote;
    segs.appendChild(p);
  } else {
    const stateColor = ["", "#e08a00", "#ddd", "#999"];
    D.segments.forEach(function (s, si) {
      const row = document.createElement("div");
      row.className = "segrow";
      const label = document.createElement("div");
      label.className = "seglabel";
      label.textContent = "0x" + (s.a === null ? "?" : s.a) + " " +
        bytes(s.s).split(" (")[0] + " " + s.ty + " stream " + s.st;
      row.appendChild(label);
      const bar = el("svg", {viewBox: "0 0 1000 1", preserveAspectRatio: "none"}, null);
      s.b.forEach(function (b, bi) {
        const [offset, size, , state, site] = b;
        el("rect", {x: offset / s.s * 1000, width: Math.max(size / s.s * 1000, 0.3), y: 0,
                    height: 1, class: "segblock", "data-s": si, "data-b": bi,
                    fill: state === 0 ? color(siteName(site)) : stateColor[state]}, bar);
      });
      row.appendChild(bar);
      segs.appendChild(row);
    });
    if (D.segmentsNote) {
      const p = document.createElement("p");
      p.className = "missing"; p.textContent = D.segmentsNote;
      segs.appendChild(p);
    }
  }

  // ---- self-test -----------------------------------------------------------------------
  const m = /selftest=(\d+)/.exec(location.hash);
  if (m) {
    const report = {bands: svg.querySelectorAll("path.band").length,
                    small: svg.querySelectorAll("path.small").length,
                    reserved: svg.querySelectorAll("path.reserved").length,
                    ooms: svg.querySelectorAll("line.oom").length,
                    segblocks: document.querySelectorAll("rect.segblock").length};
    function pointAt(node, fx, fy) {
      node.scrollIntoView({block: "center"});
      const r = node.getBoundingClientRect();
      const x = r.left + fx * r.width, y = r.top + fy * r.height;
      const target = document.elementFromPoint(x, y);
      if (target) target.dispatchEvent(new MouseEvent("mousemove", {bubbles: true, clientX: x,
                                                                     clientY: y}));
      return tip.style.display === "block" ? tip.textContent : "";
    }
    try {
      const size = +m[1];
      const i = D.bands.findIndex((b) => b[4] === size);
      if (i >= 0) {
        const [k0, end, h, , , , , , pts] = D.bands[i];
        const k1 = pts.length > 2 ? pts[2] : end;
        report.hover = pointAt(svg, (k0 + k1) / 2 / W, 1 - (pts[1] + h / 2) / Y);
      }
      (D.segments || []).some(function (s, si) {
        const bi = s.b.findIndex((b) => b[1] === size && !(b[5] > 1));
        if (bi < 0) return false;
        const bar = document.querySelectorAll(".segrow svg")[si];
        report.segHover = pointAt(bar, (s.b[bi][0] + size / 2) / s.s, 0.5);
        return true;
      });
    } catch (error) {
      __vkKeep("selftest: " + error);
    }
    report.errors = window.__vkErrors;
    document.getElementById("selftest").textContent = JSON.stringify(report);
  }
})();

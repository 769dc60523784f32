"""What a visitor sees on a rendered page, read from the browser's DOM (used by the browser tests and
``python -m posviz_tools.screenshots``).

- ``sight(page)``: the charts drawn (Vega-Lite renders SVG here, so marks and legends are elements),
  error boxes, text cut off (an element narrower than its text, an SVG label outside its chart or
  past the edge of the chart's box),
  tables that hide rows or columns behind a scroll, legends that do not name every series drawn, a chart
  that runs past its column (under the one beside it), a chart drawn with no marks, a multiselect hiding chosen
  options behind a scroll.
- ``output_fingerprint(page)``: what the page *shows*, without its widgets: the numbers in its text,
  the marks of its charts and its images. A widget move that changes only the URL or the widget's
  own label leaves it unchanged.
- ``ConsoleWatch``: browser console errors and uncaught page errors.

Playwright is only imported by the caller; nothing here needs Streamlit.
"""
from __future__ import annotations

import dataclasses
import re

# Elements whose own text must fit their box. Skipped: icons (emoji glyphs overhang by a pixel or
# two), SVG (checked against the chart's box instead), tables (canvas; checked by scroll size), code
# blocks and text areas (they scroll on purpose), tooltips (not shown until hovered).
SIGHT_JS = r"""
() => {
  const out = {cut: [], tables: [], charts: [], errorBoxes: [], images: 0};
  const shown = el => { const r = el.getBoundingClientRect(); const s = getComputedStyle(el);
    return r.width > 0 && r.height > 0 && s.visibility !== 'hidden' && s.display !== 'none'; };
  const label = el => ((el.closest('[data-testid]') || el).getAttribute('data-testid') || el.tagName.toLowerCase())
    + ' "' + (el.innerText || el.textContent || '').trim().replace(/\s+/g, ' ').slice(0, 60) + '"';
  // .katex-mathml: a formula's MathML copy for screen readers, clipped to 1 px on purpose (KaTeX draws the formula)
  const skip = 'svg, [data-testid="stDataFrame"], [data-testid="stTooltipContent"], textarea, pre, code, .katex-mathml, '
    + '[data-testid="stCode"], [data-testid*="Icon"], [data-testid="stNavSectionHeader"] ~ * [data-testid*="Icon"]';
  const roots = [...document.querySelectorAll('[data-testid="stMain"], [data-testid="stSidebar"]')];
  for (const root of roots) {
    const where = root.getAttribute('data-testid') === 'stSidebar' ? 'sidebar' : 'main';
    for (const el of root.querySelectorAll('*')) {
      if (el.closest(skip)) continue;
      const own = [...el.childNodes].some(n => n.nodeType === 3 && n.textContent.trim());
      const style = getComputedStyle(el);
      // the element that holds the text, or a box that clips its children's text (metric values, labels)
      const clips = style.textOverflow === 'ellipsis' || (style.overflowX !== 'visible' && style.overflowX !== 'auto'
                                                          && style.overflowX !== 'scroll');
      if (!own && !(clips && (el.innerText || '').trim())) continue;
      if (!shown(el) || el.clientWidth === 0) continue;
      if (el.scrollWidth > el.clientWidth + 1)
        out.cut.push(`${where}: ${label(el)} is ${el.clientWidth} px wide, its text ${el.scrollWidth} px`);
    }
    for (const df of root.querySelectorAll('[data-testid="stDataFrame"]')) {
      if (!shown(df) || df.closest('details:not([open])')) continue;  // a closed expander draws nothing yet
      const scroller = df.querySelector('.dvn-scroller');
      const grid = df.querySelector('[aria-rowcount]');
      const name = grid ? `${where}: table of ${(+grid.getAttribute('aria-rowcount')) - 1} rows` : `${where}: table`;
      if (!scroller) { out.tables.push(`${name} was not drawn`); continue; }
      if (scroller.scrollHeight > scroller.clientHeight + 2)
        out.tables.push(`${name} shows ${scroller.clientHeight} px of its ${scroller.scrollHeight} px of rows`);
      if (scroller.scrollWidth > scroller.clientWidth + 2)
        out.tables.push(`${name} shows ${scroller.clientWidth} px of its ${scroller.scrollWidth} px of columns`);
    }
    // a multiselect whose chosen chips sit in one row that scrolls: the chips past its edge are hidden
    for (const pick of root.querySelectorAll('[data-testid="stMultiSelect"]')) {
      if (!shown(pick)) continue;
      const row = [...pick.querySelectorAll('*')].find(e => e.scrollWidth > e.clientWidth + 1 && e.clientWidth > 0
        && ['auto', 'scroll', 'hidden'].includes(getComputedStyle(e).overflowX) && e.querySelector('[data-baseweb="tag"], span'));
      if (row) out.cut.push(`${where}: ${label(pick)} shows ${row.clientWidth} px of its ${row.scrollWidth} px of chosen options`);
    }
    for (const box of root.querySelectorAll('[data-testid="stAlertContentError"]'))
      out.errorBoxes.push((box.innerText || '').trim().slice(0, 300));
  }
  out.images = document.querySelectorAll('[data-testid="stMain"] [data-testid="stImage"] img, [data-testid="stMain"] [data-testid="stFullScreenFrame"] img').length;
  // how far a chart drawn in a column runs past the column's right edge, under its neighbour (0: it fits)
  const spill = (chart, drawing) => {
    const column = chart.closest('[data-testid="stColumn"]');
    if (!column || !drawing) return 0;
    return Math.max(0, Math.round(drawing.getBoundingClientRect().right - column.getBoundingClientRect().right));
  };
  for (const chart of document.querySelectorAll('[data-testid="stMain"] [data-testid="stVegaLiteChart"]')) {
    const svg = chart.querySelector('svg.marks');
    if (!svg) {
      // Vega draws large charts on a canvas: count the pixels that are not the background
      const canvas = chart.querySelector('canvas.marks');
      let drawn = 0;
      if (canvas && canvas.width && canvas.height) {
        const pixels = canvas.getContext('2d').getImageData(0, 0, canvas.width, canvas.height).data;
        for (let i = 0; i < pixels.length; i += 4 * 97)
          if (pixels[i + 3] > 0 && (pixels[i] < 240 || pixels[i + 1] < 240 || pixels[i + 2] < 240)) drawn++;
      }
      out.charts.push({drawn, cut: [], legend: [], canvas: true, spill: spill(chart, canvas), shown: shown(chart)});
      continue;
    }
    // the part of the chart a visitor sees: its SVG, clipped to the chart's own box (a chart drawn wider
    // than its column spills past the box's right edge and is cut there)
    const drawnBox = svg.getBoundingClientRect(), frame = chart.getBoundingClientRect();
    const box = {left: Math.max(drawnBox.left, frame.left), right: Math.min(drawnBox.right, frame.right),
                 top: drawnBox.top, bottom: drawnBox.bottom};
    const title = (svg.querySelector('.role-axis-title text, .role-title-text text') || {}).textContent || '';
    const cut = [...svg.querySelectorAll('text')].filter(t => t.textContent.trim()).filter(t => {
      const r = t.getBoundingClientRect();
      return r.width > 0 && (r.left < box.left - 3 || r.right > box.right + 3 || r.top < box.top - 3 || r.bottom > box.bottom + 3);
    }).map(t => t.textContent.trim());
    const legend = [];
    const labels = [...svg.querySelectorAll('.role-legend-label text')].map(t => t.textContent);
    for (const l of labels) if (l.endsWith('…')) legend.push(`legend label "${l}" is shortened`);
    for (const g of svg.querySelectorAll('.role-legend[aria-label]')) {
      const m = g.getAttribute('aria-label').match(/with (\d+) values/);
      const n = g.querySelectorAll('.role-legend-label text').length;
      if (m && +m[1] !== n) legend.push(`legend lists ${n} of its ${m[1]} values`);
    }
    // a key's symbol that draws nothing: a line (no area to fill) with no stroke, or neither fill nor stroke
    const none = c => !c || c === 'none' || c === 'transparent';
    for (const sym of svg.querySelectorAll('.role-legend-symbol path')) {
      const d = sym.getAttribute('d') || '', stroke = sym.getAttribute('stroke'), fill = sym.getAttribute('fill');
      const line = !/[AZCQz]/.test(d);
      if ((line && none(stroke)) || (none(stroke) && none(fill))) {
        const g = sym.closest('.role-legend-symbol').parentNode;
        const text = g && g.querySelector('.role-legend-label text');
        legend.push(`legend symbol of "${text ? text.textContent : '?'}" draws nothing`);
      }
    }
    const legendColours = new Set([...svg.querySelectorAll('.role-legend-symbol path')]
      .flatMap(p => [p.getAttribute('stroke'), p.getAttribute('fill')]).filter(Boolean).map(c => c.toLowerCase()));
    if (legendColours.size) {
      const byLayer = {};  // a layer drawn in two or more colours is a colour-encoded series layer
      for (const g of svg.querySelectorAll('.mark-line.role-mark, .mark-symbol.role-mark, .mark-area.role-mark')) {
        const layer = [...g.classList].find(c => c.endsWith('_marks')) || '?';
        for (const p of g.querySelectorAll('path')) {
          const c = ((g.classList.contains('mark-line') ? p.getAttribute('stroke') : (p.getAttribute('fill') || p.getAttribute('stroke'))) || '').toLowerCase();
          if (c && c !== 'none' && c !== 'transparent') (byLayer[layer] = byLayer[layer] || new Set()).add(c);
        }
      }
      for (const [layer, colours] of Object.entries(byLayer))
        if (colours.size >= 2) for (const c of colours)
          if (!legendColours.has(c)) legend.push(`a series drawn in ${c} has no legend entry`);
    }
    const drawn = svg.querySelectorAll('.role-mark > path, .role-mark > line, .role-mark > rect, .role-mark > text, .role-mark > g, .role-mark > image').length;
    out.charts.push({drawn, cut, legend: [...new Set(legend)], title, spill: spill(chart, svg), shown: shown(chart)});
  }
  return out;
}
"""

FINGERPRINT_JS = r"""
() => {
  const main = document.querySelector('[data-testid="stMain"]').cloneNode(true);
  const widgets = ['stSlider', 'stSelectbox', 'stMultiSelect', 'stRadio', 'stCheckbox', 'stNumberInput', 'stTextArea',
                   'stTextInput', 'stSelectSlider', 'stToggle', 'stButton', 'stDownloadButton', 'stSegmentedControl',
                   'stWidgetLabel', 'stTooltipContent'];
  for (const w of widgets) for (const e of main.querySelectorAll(`[data-testid="${w}"], .${w}`)) e.remove();
  const numbers = (main.innerText || main.textContent).match(/[-−+]?\d[\d,.]*/g) || [];
  const live = document.querySelector('[data-testid="stMain"]');
  const marks = [...live.querySelectorAll('[data-testid="stVegaLiteChart"] svg.marks .role-mark')]
    .map(g => [...g.children].map(c => (c.getAttribute('d') || '') + (c.getAttribute('transform') || '')
      + (c.getAttribute('fill') || '') + (c.getAttribute('x') || '') + (c.getAttribute('y') || '')
      + (c.getAttribute('width') || '') + (c.getAttribute('height') || '')).join('|'));
  const images = [...live.querySelectorAll('img')].map(i => i.src.slice(-200));
  const canvases = [...live.querySelectorAll('[data-testid="stVegaLiteChart"] canvas.marks')].map(c => {
    if (!c.width || !c.height) return 0;
    const px = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
    let sum = 0;
    for (let i = 0; i < px.length; i += 4 * 31) sum = (sum * 31 + px[i] + 7 * px[i + 1] + 13 * px[i + 2]) % 1000000007;
    return sum;
  });
  return {numbers: numbers.join(' '), marks: marks.join('#') + '#' + canvases.join(','), images: images.join(' ')};
}
"""


@dataclasses.dataclass
class Sight:
    """What ``SIGHT_JS`` read from one rendered page."""
    cut: list[str]
    tables: list[str]
    charts: list[dict]
    error_boxes: list[str]
    images: int

    @property
    def charts_with_data(self) -> int:
        return sum(1 for c in self.charts if c["drawn"] > 0)

    def cut_off(self) -> list[str]:
        """Everything shown only in part: text, tables, chart labels and legends."""
        out = list(self.cut) + list(self.tables)
        for i, chart in enumerate(self.charts, 1):
            name = f"chart {i}" + (f" ({chart['title']!r})" if chart.get("title") else "")
            out += [f"{name}: {text!r} lies outside the chart" for text in chart["cut"]]
            out += [f"{name}: {problem}" for problem in chart["legend"]]
            if chart.get("spill", 0) > 3:
                out.append(f"{name} runs {chart['spill']} px past its column, under the column beside it")
            if chart["drawn"] == 0 and chart.get("shown", True):  # a view drawn without a mark: a spec Vega could not draw (log 0, bad field)
                out.append(f"{name} is drawn with no marks")
        return out


def sight(page) -> Sight:
    raw = page.evaluate(SIGHT_JS)
    return Sight(raw["cut"], raw["tables"], raw["charts"], raw["errorBoxes"], raw["images"])


# What changes while a page re-lays out at a new window size: its height, and each chart's and table's box.
_LAYOUT_JS = """() => [document.querySelector('[data-testid="stMain"]')?.scrollHeight,
  ...Array.from(document.querySelectorAll('[data-testid="stMain"] canvas, [data-testid="stMain"] svg.marks,'
    + ' [data-testid="stMain"] [data-testid="stDataFrame"]'), e => { const r = e.getBoundingClientRect();
      return Math.round(r.width) + 'x' + Math.round(r.height); })].join(',')"""


def settle(page, step_ms: int = 150, at_least_ms: int = 300, at_most_ms: int = 1500) -> None:
    """Wait until the layout has stopped changing: the same heights and chart boxes twice ``step_ms`` apart
    (at least ``at_least_ms``, at most ``at_most_ms``). Fixed waits of 0.3 and 0.8 s a size were a tenth of the
    browser tests' time; most layouts settle in one or two steps."""
    waited, last = 0, None
    while waited < at_most_ms:
        page.wait_for_timeout(step_ms)
        waited += step_ms
        now = page.evaluate(_LAYOUT_JS)
        if now == last and waited >= at_least_ms:
            return
        last = now


# Only the charts laid out count: a slide hides the rest of its page (display: none, views/_slide.py), and Vega never
# draws a chart it has no box for, so waiting for those to draw waited out the timeout (10 s a look, two looks a slide).
_CHARTS_DRAWN_JS = """every => { const charts = [...document.querySelectorAll(
    '[data-testid="stMain"] [data-testid="stVegaLiteChart"]')].filter(c => c.getClientRects().length > 0);
  const drawn = c => c.querySelector('svg.marks .role-mark, canvas.marks');
  return every ? charts.length > 0 && charts.every(drawn) : charts.some(drawn); }"""


def wait_for_a_chart(page, at_most_ms: int = 20_000, every: bool = False) -> bool:
    """Wait until the page shows a chart with its marks drawn (``every``: every chart on it), at most ``at_most_ms``;
    whether it does. On a loaded machine a page's charts can come seconds after its script is done (Vega draws in
    the browser): a look taken before that saw no chart at all, or only the smallest, and said so of pages that
    draw them whole."""
    try:
        page.wait_for_function(_CHARTS_DRAWN_JS, arg=every, timeout=at_most_ms, polling=200)
        return True
    except Exception:  # Playwright's TimeoutError: the caller's own check says what is missing
        return False


def look_at(page, width: int, height: int) -> Sight:
    """``sight`` at ``width`` px: the window is made tall enough to hold the whole page (Streamlit draws
    tables and charts only once they scroll into view), then set back to ``height``."""
    page.set_viewport_size({"width": width, "height": height})
    settle(page)
    full = page.evaluate("""() => document.querySelector('[data-testid="stMain"]').scrollHeight""")
    page.set_viewport_size({"width": width, "height": int(min(max(full + 40, height), 12000))})
    settle(page)  # charts and tables re-lay out at the new size
    if page.evaluate(_CHARTS_DRAWN_JS, False):  # a page that draws charts: each one, now that all are in view
        wait_for_a_chart(page, at_most_ms=10_000, every=True)
    seen = sight(page)
    page.set_viewport_size({"width": width, "height": height})
    return seen


def output_fingerprint(page) -> dict[str, str]:
    """The page's numbers (widgets left out), chart marks and image sources."""
    return page.evaluate(FINGERPRINT_JS)


SLIDE_JS = r"""
() => {
  const shown = el => { const r = el.getBoundingClientRect(); const s = getComputedStyle(el);
    return r.width > 0 && r.height > 0 && s.visibility !== 'hidden' && s.display !== 'none'; };
  const sidebar = document.querySelector('[data-testid="stSidebar"]');
  const charts = [...document.querySelectorAll('[data-testid="stMain"] [data-testid="stVegaLiteChart"], '
                                              + '[data-testid="stMain"] [data-testid="stImage"] img')].filter(shown);
  const boxes = charts.map(c => c.getBoundingClientRect()).sort((a, b) => a.top - b.top);
  const first = boxes[0];
  // a chart drawn as views one under the other counts as one: the views that touch the first one's column
  const views = first ? boxes.filter(b => b.left < first.right && b.right > first.left && b.top < first.bottom + 400) : [];
  const bottom = views.reduce((m, b) => Math.max(m, b.bottom), first ? first.bottom : 0);
  return {sidebar: !!sidebar && shown(sidebar) && sidebar.getBoundingClientRect().width > 40,
          charts: charts.length, top: first ? first.top + window.scrollY : null,
          width: first ? first.width : 0, height: first ? bottom - first.top : 0};
}
"""


@dataclasses.dataclass
class Slide:
    """Presentation mode as a visitor sees it: whether the sidebar shows, and the first chart's box (px, from the top
    of the page; a chart drawn as views one under the other counts as one)."""

    sidebar: bool
    charts: int
    top: float | None
    width: float
    height: float

    def covers(self, width: int, height: int) -> float:
        """The share of a ``width``×``height`` screen the first chart covers, where it lies on the first screen."""
        if self.top is None:
            return 0.0
        seen = max(0.0, min(self.height, height - self.top))
        return min(self.width, width) * seen / (width * height)


def slide_seen(page) -> Slide:
    return Slide(**page.evaluate(SLIDE_JS))


# Streamlit's frontend first looks for its health and host-config endpoints under the page's own path
# (/rope/_stcore/health) and falls back to the root: two 404s in the console on every deep link,
# from Streamlit itself, not from the app.
_STREAMLIT_PROBE = re.compile(r"/[^/?#]+/_stcore/(health|host-config)$")


# Vega's own logger warns, not errs, when a chart cannot be drawn as specified ("WARN Log scale domain includes
# zero": FoPE's bars on a log axis drew nothing, and no console error said so). These warnings mean marks are lost.
VEGA_WARNING = re.compile(r"^WARN (Log scale domain includes zero|Invalid (scale|field|mark)|Unrecognized (scale|mark|channel))")


class ConsoleWatch:
    """Collects the console errors, Vega's warnings and the uncaught exceptions of a Playwright page from now on."""

    def __init__(self, page):
        self.errors: list[str] = []
        page.on("console", self._console)
        page.on("pageerror", lambda exc: self.errors.append(f"page error: {exc}"[:500]))

    def _console(self, message) -> None:
        if message.type == "warning" and VEGA_WARNING.search(message.text):
            self.errors.append(f"Vega warning: {message.text}"[:500])
            return
        if message.type != "error":
            return
        url = (message.location or {}).get("url", "")
        if message.text.startswith("Failed to load resource") and _STREAMLIT_PROBE.search(url.split("?")[0]):
            return
        self.errors.append(f"console error: {message.text} ({url})"[:500])

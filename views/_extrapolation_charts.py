"""The Extrapolation lab's charts, built from what the page computed (no maths: the numbers are
``posviz.labs.extrapolation``'s). Each returns an Altair chart, or (chart, data) for ``show_cached_chart``."""
from __future__ import annotations

import altair as alt
import numpy as np
import pandas as pd

from posviz.labs import attention_maps, inputs as lab_inputs
from posviz.display import display_name


# In two columns: in one, a dozen checkpoints' entries (spaced for the live points' size) ran past the
# chart's 360 px at 1366x768 and the last ones were cut off; below the chart, they squeezed its plot.
# symbolOpacity 1: a seed band (an area at 0.18) would otherwise wash its swatch out to a tint
LEGEND = alt.Legend(columns=2, symbolSize=90, labelLimit=160, symbolOpacity=1)


# The key of the two sources a chart draws (on a slide, the dot and the curve of one checkpoint differ by the text)
KEY = alt.TitleParams("dashed lines: stored, the held-out validation set  ·  big dots: live, this document",
                      anchor="start", color="#555", fontWeight="normal")  # its size the slide's config sets (13 px drew 8 in a PNG)


def bpb_chart(shipped: pd.DataFrame, live: pd.DataFrame, colours, unit: str, train_length: int, length: int,
              multiple: float | None = None, band: pd.DataFrame | None = None) -> alt.LayerChart:
    """Bits per byte against the evaluation length: the stored curves dashed, live results as big dots, and with
    ``band`` (rows {model, length, lowest, highest, seeds}) each curve's range over its training seeds, shaded. With
    ``multiple`` (models of different units or contexts): against the multiple of each one's trained context."""
    if multiple is not None:
        return multiple_chart(shipped, live, colours, multiple)
    x = alt.X("length:Q", scale=alt.Scale(type="log", base=2), title=f"evaluation length ({unit}s, log scale)")
    y = alt.Y("bits/byte:Q", title="bits per byte (lower is better)", scale=alt.Scale(zero=False))
    colour = alt.Color("model:N", scale=colours, title="checkpoint", legend=LEGEND)
    layers = [] if band is None or band.empty else [  # under the lines: the seeds' lowest to highest
        alt.Chart(band).mark_area(opacity=0.18).encode(
            x, alt.Y("lowest:Q", title="bits per byte (lower is better)", scale=alt.Scale(zero=False)),
            alt.Y2("highest:Q"), colour,
            tooltip=["model", "length", alt.Tooltip("lowest:Q", format=".3f"), alt.Tooltip("highest:Q", format=".3f"),
                     alt.Tooltip("seeds:Q", title="training seeds")])]
    layers += [] if shipped.empty else [  # no stored curves (published models): live points only
        alt.Chart(shipped).mark_line(point=alt.OverlayMarkDef(size=30), strokeDash=[4, 3], opacity=0.7)
        .encode(x, y, colour, tooltip=["model", "length", alt.Tooltip("bits/byte:Q", format=".3f"), "source",
                                       alt.Tooltip("interval:N", title="over the windows")])]
    if not live.empty:
        layers.append(alt.Chart(live).mark_point(size=220, filled=True, stroke="black", strokeWidth=1.2)
                      .encode(x, y, colour, tooltip=["model", "length", alt.Tooltip("bits/byte:Q", format=".3f"),
                                                     "source"]))
    rules = pd.DataFrame({"length": [train_length], "what": ["training length = this length"]}) if length == train_length \
        else pd.DataFrame({"length": [train_length, length], "what": ["training length", "this length"]})
    layers.append(alt.Chart(rules).mark_rule(strokeDash=[2, 2], color="grey").encode(
        x="length:Q", tooltip=["what", "length"]))
    layers.append(alt.Chart(rules).mark_text(align="left", dx=4, dy=-6, color="grey", baseline="top").encode(
        x="length:Q", y=alt.value(0), text="what"))
    return alt.layer(*layers).properties(height=360, title=KEY)


def multiple_chart(shipped: pd.DataFrame, live: pd.DataFrame, colours, multiple: float) -> alt.LayerChart:
    """bpb against the multiple of each model's trained context: bytes and tokens on one axis."""
    x = alt.X("multiple:Q", scale=alt.Scale(type="log", base=2), title="multiple of trained context (log scale)")
    y = alt.Y("bits/byte:Q", title="bits per byte (lower is better)", scale=alt.Scale(zero=False))
    colour = alt.Color("model:N", scale=colours, title="model", legend=LEGEND)
    tip = ["model", alt.Tooltip("multiple:Q", format="g"), "length", alt.Tooltip("bits/byte:Q", format=".3f"), "source"]
    layers = [] if shipped.empty else [
        alt.Chart(shipped).mark_line(point=alt.OverlayMarkDef(size=30), strokeDash=[4, 3], opacity=0.7)
        .encode(x, y, colour, tooltip=tip + [alt.Tooltip("interval:N", title="over the windows")])]
    if not live.empty:
        layers.append(alt.Chart(live).mark_point(size=220, filled=True, stroke="black", strokeWidth=1.2)
                      .encode(x, y, colour, tooltip=tip))
    rules = pd.DataFrame({"multiple": [1.0], "what": ["trained context = this length"]}) if multiple == 1 \
        else pd.DataFrame({"multiple": [1.0, multiple], "what": ["trained context", "this length"]})
    layers.append(alt.Chart(rules).mark_rule(strokeDash=[2, 2], color="grey").encode(
        x="multiple:Q", tooltip=["what", "multiple"]))
    layers.append(alt.Chart(rules).mark_text(align="left", dx=4, dy=-6, color="grey", baseline="top").encode(
        x="multiple:Q", y=alt.value(0), text="what"))
    return alt.layer(*layers).properties(height=360, title=KEY)


def multiple_loss_chart(scores: dict, lengths: dict, models: dict, colours, multiple: float) -> tuple[alt.LayerChart, pd.DataFrame]:
    """Each model's loss by position as a fraction of its own trained context (its ids differ)."""
    frames = []
    for name, s in scores.items():
        raw = np.asarray(s["position_bits"], dtype=float)
        smoothed = lab_inputs.moving_average(raw, max(1, lengths[name] // 64))
        keep = np.isfinite(smoothed)
        position = np.arange(raw.size)
        frames.append(pd.DataFrame({"model": display_name(name), "position": position[keep],
                                    "multiple": position[keep] / models[name].train_length, "bits": smoothed[keep],
                                    "raw bits": raw[keep], "unit": models[name].unit}))
    pos_df = pd.concat(frames, ignore_index=True)
    # keyed by the name the frame holds (its display name)
    every = {display_name(n): max(1, lengths[n] // 512) for n in scores}
    last = {display_name(n): lengths[n] - 1 for n in scores}
    drawn = pos_df[[p % every[m] == 0 or p == last[m] for m, p in zip(pos_df["model"], pos_df["position"])]]
    x = alt.X("multiple:Q", title="position in the window ÷ the model's trained context")
    lines = alt.Chart(drawn).mark_line().encode(
        x, alt.Y("bits:Q", title="mean loss per id (bits)", scale=alt.Scale(zero=False)),
        alt.Color("model:N", scale=colours, title="model"),
        tooltip=["model", "position", "unit", alt.Tooltip("bits:Q", format=".3f"), alt.Tooltip("raw bits:Q", format=".3f")])
    layers = [lines]
    if multiple > 1:
        mark = pd.DataFrame({"multiple": [1.0], "what": ["trained context"]})
        layers += [alt.Chart(mark).mark_rule(strokeDash=[4, 3], color="grey").encode(x="multiple:Q"),
                   alt.Chart(mark).mark_text(align="left", dx=4, color="grey", baseline="top").encode(
                       x="multiple:Q", y=alt.value(0), text="what")]
    return alt.layer(*layers).properties(height=320), pos_df


def loss_chart(scores: dict, length: int, smooth: int, train_length: int, unit: str,
               colours) -> tuple[alt.LayerChart, pd.DataFrame]:
    """Mean loss at each position of the window, per model."""
    # Draw at most ~512 points a line (the smoothing window is wider than the gap between them); the CSV
    # keeps every position. Thousands of points per line made the browser, not the model, the slow part.
    drawn_every = max(1, length // 512)
    frames = []
    for name, s in scores.items():
        raw = np.asarray(s["position_bits"], dtype=float)
        smoothed = lab_inputs.moving_average(raw, smooth)
        keep = np.isfinite(smoothed)
        frames.append(pd.DataFrame({"model": display_name(name), "position": np.arange(raw.size)[keep], "bits": smoothed[keep],
                                    "raw bits": raw[keep]}))
    pos_df = pd.concat(frames, ignore_index=True)
    drawn = pos_df[(pos_df["position"] % drawn_every == 0) | (pos_df["position"] == length - 1)]
    x = alt.X("position:Q", title=f"position in the window (the prediction made there sees position + 1 {unit}s)")
    lines = alt.Chart(drawn).mark_line().encode(
        x, alt.Y("bits:Q", title="mean loss (bits)", scale=alt.Scale(zero=False)),
        alt.Color("model:N", scale=colours, title="checkpoint", legend=LEGEND),
        tooltip=["model", "position", alt.Tooltip("bits:Q", format=".3f"), alt.Tooltip("raw bits:Q", format=".3f")])
    layers = [lines]
    if train_length < length:
        mark = pd.DataFrame({"position": [train_length], "what": ["training length"]})
        layers += [alt.Chart(mark).mark_rule(strokeDash=[4, 3], color="grey").encode(x="position:Q"),
                   alt.Chart(mark).mark_text(align="left", dx=4, color="grey", baseline="top").encode(
                       x="position:Q", y=alt.value(0), text="what")]
    return alt.layer(*layers).properties(height=320), pos_df


def growth_chart(view, growth_at, unit: str, trained: int, value: str, title: str,
                 fmt: str) -> tuple[alt.LayerChart, pd.DataFrame]:
    """Each head's attention distance or entropy as the window grows, up to the inspected length."""
    # Read off the map's own forward pass: the first n queries of a causal model attend as a window of n would.
    growth = pd.DataFrame(attention_maps.prefix_growth(view, growth_at))
    growth["head"] = growth["head"].map(lambda h: f"head {h}")
    x = alt.X("length:Q", scale=alt.Scale(type="log", base=2), title=f"window length ({unit}s, log scale)")
    rule = alt.Chart(pd.DataFrame({"length": [trained]})).mark_rule(strokeDash=[4, 3], color="grey").encode(
        x="length:Q")
    return alt.layer(alt.Chart(growth).mark_line(point=True).encode(
        x, alt.Y(f"{value}:Q", title=title), alt.Color("head:N", title=None),
        tooltip=["head", "length", alt.Tooltip(f"{value}:Q", format=fmt)]), rule).properties(height=280), growth

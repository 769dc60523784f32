"""Write docs/published_models.md's table of published models past their context from their stored results.

    python -m posviz_tools.published_table          # rewrite the table between its markers
    python -m posviz_tools.published_table --check  # exit 1 if the doc's table is not what the results give

One table per file of ``results/published/`` (``posviz_tools.measure_published`` writes them): bits per byte on the
held-out standard library at each measured multiple of the model's own context, plain, under the RoPE scaling and
under each remap (its settings at the longest length), the effective context length where it was measured, and
what each row cost in CPU minutes on the machine named. No number is typed: every cell is read from the file.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from posviz.display import display_name
from posviz.labs.published_results import results_dir

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "published_models.md"
START, END = "<!-- published-table:start -->", "<!-- published-table:end -->"


def _bpb(value) -> str:
    return "cannot run" if value is None else f"{value:.3f}"


def _settings(options: dict | None) -> str:
    if not options:
        return ""
    return ", ".join(f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}" for k, v in options.items())


def _effective(block: dict | None) -> str:
    if not block:
        return "not measured"
    multiple = block.get("multiple")
    gains = ", ".join(f"{k}×: {row['gain']:.2f}" for k, row in block.get("rows", {}).items() if row)
    return f"{'not measurable' if multiple is None else f'{multiple:g}×'} ({block.get('reason', '')}; bits saved: {gains})"


def model_table(record: dict) -> str:
    """The markdown of one model's record."""
    ev, L, unit = record["eval"], record["train_length"], record.get("unit", "token")
    lengths = sorted(int(n) for n in ev.get("nonoverlapping_bpb", {}))
    seconds = record.get("seconds", {})
    head = ["variant"] + [f"{n / L:g}× ({n:,} {unit}s)" for n in lengths]
    if len(lengths) > 1:
        head.append(f"{lengths[-1] / L:g}× ÷ 1×")
    head += [f"settings at {lengths[-1] / L:g}×", "minutes"]
    rows = [("plain", ev.get("nonoverlapping_bpb", {}), {}, seconds.get("nonoverlapping_bpb"))]
    for group in ("rope_scalings", "rope_remaps"):
        for name, block in ev.get(group, {}).items():
            settings = block.get("remap_options", {}).get(str(lengths[-1])) if group == "rope_remaps" else {
                "factor": lengths[-1] / L}
            rows.append((display_name(name), block.get("nonoverlapping_bpb", {}), settings, seconds.get(f"{group}.{name}")))
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for label, table, settings, spent in rows:
        cells = [label] + [_bpb(table.get(str(n))) for n in lengths]
        if len(lengths) > 1:
            first, last = table.get(str(lengths[0])), table.get(str(lengths[-1]))
            cells.append("" if first is None or last is None else f"{last / first:.2f}")
        cells += [_settings(settings), "" if spent is None else f"{spent / 60:.1f}"]
        lines.append("| " + " | ".join(cells) + " |")
    effective = ev.get("effective_length", {})
    notes = [f"- Effective context length, plain: {_effective(effective.get('as_trained'))}.",
             f"- Effective context length under Self-Extend: {_effective(effective.get('self_extend'))}."]
    for name in effective:
        if name not in ("as_trained", "self_extend"):
            notes.append(f"- Effective context length under {display_name(name)}: {_effective(effective[name])}.")
    cost = sum(seconds.values()) / 60
    command = " ".join(Path(word).name if word.startswith("/") else word for word in record.get("command", "").split())
    return "\n".join([
        f"**{record['model']}** ({record.get('method', 'rope')}, trained context {L:,} {unit}s), on the first "
        f"{record['eval_ids']:,} {unit}s ({record['eval_bytes']:,} bytes) of the held-out standard library, "
        f"non-overlapping windows; {record.get('machine', '')}, {record.get('threads', '?')} threads, "
        f"{cost:.0f} minutes of wall time in all (minutes: each row's).", "", *lines, "", *notes, "",
        f"Command (the model's path shortened to its file name): `{command}`"])


def tables() -> str:
    files = sorted(results_dir().glob("*.json"))
    if not files:
        return "No published model has stored results yet (`python -m posviz_tools.measure_published`)."
    return "\n\n".join(model_table(json.loads(f.read_text())) for f in files)


def updated(text: str) -> str:
    if START not in text or END not in text:
        raise SystemExit(f"{DOC}: the markers {START} and {END} are missing")
    before, rest = text.split(START, 1)
    _, after = rest.split(END, 1)
    return f"{before}{START}\n{tables()}\n{END}{after}"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--check", action="store_true")
    args = ap.parse_args(argv)
    text = DOC.read_text()
    new = updated(text)
    if args.check:
        if new != text:
            print(f"{DOC}: the published models' table is stale: run python -m posviz_tools.published_table", file=sys.stderr)
            return 1
        return 0
    DOC.write_text(new)
    print(f"wrote {DOC}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

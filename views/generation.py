"""Generation lab: several checkpoints continue one prompt side by side, past their training length.

Each model writes in its own ids (bytes for a checkpoint, tokens for a published model): counts, positions
and speeds are in them, bits per byte through the bytes each id covers.
"""
from __future__ import annotations

import hashlib
import time

import altair as alt
import pandas as pd
import streamlit as st

from posviz.slides import extremes_sentence
from views._charts import csv_file, method_scales, show_cached_chart
from views._models import usable_models
from views._page import error_box, page_header, plain
from views._serving import compute_once, heavy_turn, shared, store_result, stored_result
from views._text import choose_text, coloured_html
from views._url import qp_choice, qp_float, qp_int, qp_multi, sync_url
from posviz.labs import generation
from posviz.labs.inputs import in_units, shared_unit, unit_note, when_not_bytes
from posviz.models.interface import open_model
from posviz.errors import PosvizError
from posviz.limits import MAX_PROMPT_BYTES, default_device, device_label
from posviz.display import display_name

page_header(
    "Generation lab",
    "Scoring a text is one thing; writing is another. Give the checkpoints a prompt and watch each one write, "
    "byte by byte with its own KV cache, until well past the length it was trained on.",
)


GREEDY_LOOPS = (
    "Why sampling by default: greedy decoding always takes the single most likely byte, and for a small model the "
    "most likely next phrase is one it has just written, so every checkpoint soon loops (\u201cthe contains of the "
    "contains of \u2026\u201d) and they all look alike. Sampling with a fixed seed (the same link writes the same "
    "text) shows what each model writes once its text passes the training length.")

catalog = usable_models(open_model)  # each resolved once for this run; weights load when run
models, names = catalog.models, catalog.names
train_length = models[names[0]].train_length
strategies_slot = st.empty()  # filled below, once the chosen models say what an id is (bytes or tokens)

# ------------------------------------------------------------------------------------------------
# Controls (every one in the URL)
# ------------------------------------------------------------------------------------------------
left, right = st.columns(2)
with left:
    # Two by default that write very differently once the text passes the training length (KERPLE keeps
    # writing code-shaped text, sinusoidal falls apart right after it): every byte is a forward pass per
    # model, so two keep a CPU visitor's wait short. RoPE, NoPE and the rest are one click away.
    default_models = [n for n in generation.DEFAULT_MODELS if n in names] or names[:2]
    catalog.add_input()
    chosen = st.multiselect(catalog.say("Checkpoints", "Models"), names, format_func=catalog.label,
                            default=qp_multi("models", default_models, names), key="w_models",
                            help="Each writes its own continuation, with its own KV cache.", wrap=True)
    catalog.caption()
    unit = shared_unit(models[n] for n in chosen)  # what every count below is in: "byte", "token" or "id" (a mix)
    # each model may write a multiple of its own training length; the slider holds the chosen models' smallest
    bounds = {n: (generation.max_new_bytes(models[n].train_length, models[n].device), models[n].length_cap) for n in chosen}
    cap = min((min(bound) for bound in bounds.values()), default=generation.max_new_bytes(train_length, default_device()))
    multiple = generation.max_new_bytes(1, default_device())
    binding = min(bounds, key=lambda n: min(bounds[n]), default=None)  # the model whose bound is the cap
    capped_by = (f"{plain(display_name(binding))}'s length cap on this device" if binding is not None and bounds[binding][1] < bounds[binding][0]
                 else f"{multiple} × the training length")
    new_ids = st.slider(f"{unit.capitalize()}s to write (at most {cap:,} here: {capped_by})",
                        16, cap, value=qp_int("n", min(generation.DEFAULT_NEW_BYTES, cap), 16, cap), step=4, key="w_n",
                        help=f"Capped per device ({device_label()})." + when_not_bytes(unit, f" In {unit_note(unit)}."))
    decode = st.radio("Decoding", ["sample", "greedy"], index=["sample", "greedy"].index(
        qp_choice("decode", "sample", ["greedy", "sample"])), horizontal=True, key="w_decode",
        format_func={"greedy": f"Greedy (most likely {unit})", "sample": "Sample (fixed seed)"}.get)
    st.caption(in_units(GREEDY_LOOPS, unit))
    c1, c2, c3 = st.columns(3)
    temperature = c1.slider("Temperature", 0.1, generation.MAX_TEMPERATURE, step=0.1, key="w_temp",
                            value=qp_float("temp", generation.DEFAULT_TEMPERATURE, 0.1, generation.MAX_TEMPERATURE), disabled=decode == "greedy")
    top_k = c2.slider("Top-k (0 = off)", 0, generation.MAX_TOP_K, value=qp_int("topk", generation.DEFAULT_TOP_K, 0, generation.MAX_TOP_K),
                      key="w_topk", disabled=decode == "greedy")
    seed = c3.number_input("Seed", 0, 2**31 - 1, value=qp_int("seed", 0, 0, 2**31 - 1), step=1, key="w_seed",
                           disabled=decode == "greedy", help="The same seed and settings write the same text.")
    strategy = st.radio("Past the training length…", list(generation.STRATEGIES),
                        index=list(generation.STRATEGIES).index(qp_choice("window", "stop", generation.STRATEGIES)),
                        format_func=lambda key: generation.strategy_title(key, unit), key="w_window")
    colour_by = st.radio(in_units("Colour each byte by", unit), ["surprisal", "entropy"], horizontal=True, key="w_colour",
                         index=["surprisal", "entropy"].index(qp_choice("colour", "surprisal", ["surprisal", "entropy"])),
                         help=in_units("Surprisal: bits the model paid for the byte it wrote. Entropy: how unsure it was.", unit)
                              + when_not_bytes(unit, " A token's bits are shared evenly by its bytes."))
with strategies_slot.container():
    with st.expander("When the window is full", expanded=False):
        for key in generation.STRATEGIES:
            title = generation.strategy_title(key, unit)  # the strategy's one name, the KV cache lab's too
            st.markdown(f"**{title[:1].upper() + title[1:]}** — {generation.strategy_how(key, unit)}")
        st.caption(in_units("Re-encoding and shifting are for absolute methods: relative methods (ALiBi, T5, Shaw, "
                            "RoPE) and NoPE keep every byte at its true position, their cache valid as the text grows. "
                            "StreamingLLM's window applies to every method.", unit))
with right:
    text = choose_text()
sync_url(models=chosen, n=new_ids, decode=decode, temp=temperature, topk=top_k, seed=int(seed), window=strategy,
         colour=colour_by)
if not chosen:
    st.info("Pick at least one checkpoint.")
    st.stop()
if text is None:
    st.stop()
chosen = catalog.ready(chosen)  # a published model's weights load now, under a progress bar
if not chosen:
    st.info("Pick at least one other model.")
    st.stop()
with right:
    hi = max(2, min(MAX_PROMPT_BYTES, len(text)))
    prompt_length = st.slider("Prompt: the text's first … bytes", 1, hi, value=qp_int("p", min(generation.DEFAULT_PROMPT_BYTES, hi), 1, hi), key="w_p",
                              help=f"At most {MAX_PROMPT_BYTES:,} bytes. A prompt shorter than the training length "
                                   f"({train_length:,}) lets you watch the context pass it.")
sync_url(p=prompt_length)

ids = text.ids.tolist()
# A tokenizer reads text, not loose bytes: the prompt ends on a whole character.
cut = generation.character_start(text.as_bytes(), prompt_length)
prompt = ids[:cut]  # the prompt's bytes; each model writes after its own ids of them
from_document = st.session_state.get("w_src") == "doc"
real = ids[cut:cut + new_ids] if from_document else []  # a checkpoint's real continuation: bytes are its ids
rest = text.as_bytes()[cut:] if from_document else b""  # a tokenizer's: its first new_ids tokens of what follows
try:
    settings = generation.DecodeSettings(int(new_ids), temperature=0.0 if decode == "greedy" else float(temperature),
                                         top_k=int(top_k), seed=int(seed), strategy=strategy)
    generation.check_prompt(prompt)
except PosvizError as exc:
    error_box(exc)
    st.stop()
with st.expander(f"Prompt ({len(prompt):,} bytes)", expanded=False):
    st.code(bytes(prompt).decode("utf-8", errors="replace"), language=None, wrap_lines=True)


def units_of(name: str) -> str:
    """What one of this model's ids is, in the plural: "bytes" or "tokens"."""
    return f"{models[name].unit}s"


def prompt_ids(name: str) -> list[int]:
    return models[name].tokenize(bytes(prompt)).ids.tolist()


# ------------------------------------------------------------------------------------------------
# Write, streaming the text to the page (results are kept: moving another widget does not rewrite)
# ------------------------------------------------------------------------------------------------
st.subheader("Side by side")


def marker(name: str) -> str:
    """Where the context first holds more than the training length, in the model's own ids."""
    W, one = models[name].train_length, models[name].unit
    return (f"the context passes the training length ({W:,} {one}s): this {one} is the first predicted "
            f"from more than {W:,} {one}s")


keys = {name: models[name].key + (bytes(prompt), settings) for name in chosen}
results: dict[str, generation.Generation] = {}
for name in chosen:
    found, value = stored_result("generation", keys[name])
    if found:
        results[name] = value
per_row = min(3, len(chosen))
slots = {}
for start in range(0, len(chosen), per_row):
    cols = st.columns(per_row)
    for col, name in zip(cols, chosen[start:start + per_row]):
        with col:
            st.markdown(f"**{plain(display_name(name))}**")
            slots[name] = {"stats": st.empty(), "note": st.empty(), "text": st.empty()}

pending = [name for name in chosen if name not in results]
if pending:
    decoders = {}
    for name in pending:
        try:
            decoders[name] = generation.Decoder(models[name], prompt_ids(name), settings)
        except PosvizError as exc:
            slots[name]["note"].error(str(exc), icon="🚫")
    # Steps between page updates: often enough to watch; each update resends all the text so far, and at 24
    # the updates of two models (75 for 900 bytes) cost the browser more than the writing.
    REFRESH = 64
    written = 0
    started = time.perf_counter()
    with heavy_turn(f"Writing with {', '.join(map(plain, decoders))}…"):  # the server's work queue: one heavy job at a time
        while any(not d.done for d in decoders.values()):
            for name, decoder in decoders.items():
                decoder.step()
            written += 1
            if written % REFRESH == 0:
                for name, decoder in decoders.items():
                    # the whole sequence decoded each time: a character split over two tokens comes out whole
                    slots[name]["text"].code(decoder.text + "▌", language=None, wrap_lines=True)
                    rate = len(decoder.generated) / decoder.seconds if decoder.seconds else 0.0
                    slots[name]["stats"].caption(f"{len(decoder.generated):,} / {new_ids:,} {units_of(name)} · "
                                                 f"{rate:,.0f} {units_of(name)}/s")
    for name, decoder in decoders.items():
        results[name] = decoder.result()
        store_result("generation", keys[name], results[name])

top = 8.0 if colour_by == "surprisal" else 6.0
for name in chosen:
    if name not in results:
        continue
    r = results[name]
    own = f"{r.bits_per_byte:.2f} bits/byte on its own text" if r.ids else "nothing written"
    rate = f"{r.ids_per_second:,.0f} {units_of(name)}/s" if r.ids else f"— {units_of(name)}/s"
    slots[name]["stats"].caption(f"{len(r.ids):,} {units_of(name)} · {rate} · {own}"
                                 + ("" if r.strategy == strategy else " · true positions (not an absolute method)"))
    if r.error:
        slots[name]["note"].warning(f"**{plain(display_name(name))}** stopped: {r.error}", icon="⚠️")

    def coloured(r=r, name=name) -> str:
        chars, mark = generation.coloured_characters(r, r.surprisal if colour_by == "surprisal" else r.entropy)
        shared_out = when_not_bytes(r.unit, " per byte (a token's shared by its bytes)")
        return coloured_html(chars, top=top, unit=f"bits of {colour_by}{shared_out}", height=360, mark_at=mark,
                             mark_label=marker(name))

    with slots[name]["text"].container():
        st.html(shared("generation-coloured", keys[name] + (colour_by,), coloured))  # built once per result
        with st.expander("Plain text"):
            st.code(r.text, language=None, wrap_lines=True)

done = {n: results[n] for n in chosen if n in results}
if not done:
    st.stop()
done_unit = shared_unit(models[n] for n in done)  # what the ids of the models that wrote are

# ------------------------------------------------------------------------------------------------
# The real continuation, teacher-forced
# ------------------------------------------------------------------------------------------------
rest_key = hashlib.sha256(rest).hexdigest()


def score_real(name: str) -> generation.Generation:
    """The document's real continuation scored through the model's cache and window strategy: a checkpoint's
    next ``new_ids`` bytes, a tokenizer's first ``new_ids`` tokens of the rest of the document."""
    model = models[name]
    continuation = model.tokenize(rest).ids[:new_ids].tolist()
    return generation.teacher_forced(model, prompt_ids(name), continuation, strategy)


if from_document and real:
    st.subheader("Its own text against the document's real continuation")
    rows, notes = [], []
    for name in done:
        model = models[name]
        what = (rest_key, new_ids)  # what the real continuation depends on
        try:
            forced = compute_once(
                "teacher_forced", model.key + (bytes(prompt), what, strategy),
                lambda progress, name=name: score_real(name), f"{plain(display_name(name))}: scoring the real continuation…")
        except PosvizError as exc:
            error_box(exc)
            continue
        # bits per byte either way (a token's bits over the bytes it covers); the bytes its scored ids cover
        rows.append({"checkpoint": display_name(name), "bits/byte, its own text": done[name].bits_per_byte,
                     "bits/byte, the real continuation": forced.bits_per_byte, "bytes scored": forced.n_bytes})
        if forced.error:  # below the table, whole: a table cell cut it off
            notes.append(f"**{plain(display_name(name))}**: {forced.error}")
    if rows:
        table = pd.DataFrame(rows).set_index("checkpoint")
        numbers = ["bits/byte, its own text", "bits/byte, the real continuation"]
        table[numbers] = table[numbers].astype(float)  # a model that wrote nothing has NaN, shown as "—"
        st.dataframe(table.style.format({"bits/byte, its own text": "{:.3f}", "bits/byte, the real continuation": "{:.3f}"},
                                        na_rep="—"), width="stretch", height="content")
        for note in notes:
            st.caption(note)
        st.caption(in_units("The real continuation is read through the same cache and window strategy, one byte at a "
                            "time (teacher forcing). A model's own text is usually cheaper for it than the real one: it "
                            "wrote what it found likely.", done_unit))

# ------------------------------------------------------------------------------------------------
# Entropy per position window
# ------------------------------------------------------------------------------------------------
width = max(8, models[next(iter(done))].train_length // 4)
count = f"{done_unit}s"  # the column counting each window's ids: "bytes" for checkpoints
rows = [{"checkpoint": display_name(name), "position": w["window start"], **w}
        for name, r in done.items() for w in generation.window_means(r.entropy, r.prompt_length, width, count)]
if rows:
    df = pd.DataFrame(rows)
    colours, dashes = method_scales([display_name(n) for n in done])
    trained = sorted({models[n].train_length for n in done})  # each model's, in its own ids
    lines = alt.Chart(df).mark_line(point=True).encode(
        x=alt.X("position:Q", title=f"position in the text (windows of {width} {unit_note(done_unit)})"),
        y=alt.Y("mean:Q", title=in_units("mean entropy of the next byte (bits)", done_unit), scale=alt.Scale(zero=False)),
        color=alt.Color("checkpoint:N", scale=colours, title="checkpoint"),
        strokeDash=alt.StrokeDash("checkpoint:N", scale=dashes, title="checkpoint"),
        tooltip=["checkpoint", "window start", "window end", alt.Tooltip("mean:Q", format=".3f"), count])
    rule = alt.Chart(pd.DataFrame({"position": trained})).mark_rule(color="grey", strokeDash=[4, 3]).encode(
        x="position:Q")
    lengths = ", ".join(f"{t:,}" for t in trained) + when_not_bytes(done_unit, f" {unit_note(done_unit)}")
    show_cached_chart(("generation-entropy",) + tuple(keys[n] for n in done) + (width,),
                      lambda: (alt.layer(lines, rule).properties(height=360), df), f"generation-entropy-{strategy}-n{new_ids}",
                      f"Grey line: the training length ({lengths}). A model that no longer knows where it is "
                      "usually becomes unsure (entropy up) or stuck in a loop (entropy down to 0).",
                      says=lambda: extremes_sentence(df, "checkpoint", "position", "mean", "mean entropy of the next byte, in bits,",
                                             lambda p: f"position {int(p):,}", digits=2))

# ------------------------------------------------------------------------------------------------
# Export
# ------------------------------------------------------------------------------------------------
texts = "\n\n".join(f"=== {name} ({results[name].strategy}, {len(results[name].ids):,} {units_of(name)}) ===\n"
                      f"{results[name].text}" for name in done)
per_id = pd.DataFrame([row for name, r in done.items() for row in generation.per_byte_rows(name, r)])
c1, c2 = st.columns(2)
c1.download_button("Texts (plain text)", texts.encode("utf-8"), file_name="generation.txt", mime="text/plain",
                   key="dl-texts")
c2.download_button(in_units("Per-byte numbers (CSV)", done_unit), csv_file(per_id),
                   file_name="generation.csv", mime="text/csv", key="dl-csv")

"""Generation lab: several checkpoints continue one prompt side by side, past their training length."""
from __future__ import annotations

import time

import altair as alt
import pandas as pd
import streamlit as st

from views._charts import method_scales, show_chart
from views._page import error_box, page_header, usable_checkpoints
from views._serving import compute_once, heavy_turn, store_result, stored_result
from views._text import choose_text, show_coloured_text
from views._url import qp_choice, qp_float, qp_int, qp_multi, sync_url
from posviz import generation, lab_inputs
from posviz.lab_model import open_model
from posviz.errors import PosvizError
from posviz.limits import MAX_PROMPT_BYTES, default_device, device_label

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

checkpoints, models = usable_checkpoints(open_model)  # each resolved once for this run; weights load when run
names = list(models)
train_length = models[names[0]].train_length
cap = generation.max_new_bytes(train_length, default_device())

with st.expander("When the window is full (absolute methods)", expanded=False):
    for key in generation.STRATEGIES:
        st.markdown(f"**{generation.STRATEGY_TITLES[key]}** (`{key}`) — {generation.STRATEGY_HOW[key]}")
    st.caption("Relative methods (ALiBi, T5, Shaw, RoPE) and NoPE always keep every byte at its true position: "
               "their cache stays valid as the text grows.")

# ------------------------------------------------------------------------------------------------
# Controls (every one in the URL)
# ------------------------------------------------------------------------------------------------
left, right = st.columns(2)
with left:
    # Two by default that write very differently once the text passes the training length (KERPLE keeps
    # writing code-shaped text, sinusoidal falls apart right after it): every byte is a forward pass per
    # model, so two keep a CPU visitor's wait short. RoPE, NoPE and the rest are one click away.
    default_models = [n for n in generation.DEFAULT_MODELS if n in names] or names[:2]
    chosen = st.multiselect("Checkpoints", names, default=qp_multi("models", default_models, names), key="w_models",
                            help="Each writes its own continuation, with its own KV cache.")
    new_bytes = st.slider(f"Bytes to write (at most {cap:,} here: {cap // train_length} × the training length)",
                          16, cap, value=qp_int("n", min(generation.DEFAULT_NEW_BYTES, cap), 16, cap), step=4, key="w_n",
                          help=f"Capped per device ({device_label()}).")
    decode = st.radio("Decoding", ["sample", "greedy"], index=["sample", "greedy"].index(
        qp_choice("decode", "sample", ["greedy", "sample"])), horizontal=True, key="w_decode",
        format_func={"greedy": "Greedy (most likely byte)", "sample": "Sample (fixed seed)"}.get)
    st.caption(GREEDY_LOOPS)
    c1, c2, c3 = st.columns(3)
    temperature = c1.slider("Temperature", 0.1, generation.MAX_TEMPERATURE, step=0.1, key="w_temp",
                            value=qp_float("temp", generation.DEFAULT_TEMPERATURE, 0.1, generation.MAX_TEMPERATURE), disabled=decode == "greedy")
    top_k = c2.slider("Top-k (0 = off)", 0, generation.MAX_TOP_K, value=qp_int("topk", generation.DEFAULT_TOP_K, 0, generation.MAX_TOP_K),
                      key="w_topk", disabled=decode == "greedy")
    seed = c3.number_input("Seed", 0, 2**31 - 1, value=qp_int("seed", 0, 0, 2**31 - 1), step=1, key="w_seed",
                           disabled=decode == "greedy", help="The same seed and settings write the same text.")
    strategy = st.radio("Past the training length, absolute methods…", list(generation.STRATEGIES),
                        index=list(generation.STRATEGIES).index(qp_choice("window", "stop", generation.STRATEGIES)),
                        format_func=generation.STRATEGY_TITLES.get, key="w_window")
    colour_by = st.radio("Colour each byte by", ["surprisal", "entropy"], horizontal=True, key="w_colour",
                         index=["surprisal", "entropy"].index(qp_choice("colour", "surprisal", ["surprisal", "entropy"])),
                         help="Surprisal: bits the model paid for the byte it wrote. Entropy: how unsure it was.")
with right:
    text = choose_text()
sync_url(models=chosen, n=new_bytes, decode=decode, temp=temperature, topk=top_k, seed=int(seed), window=strategy,
         colour=colour_by)
if not chosen:
    st.info("Pick at least one checkpoint.")
    st.stop()
if text is None:
    st.stop()
with right:
    hi = max(2, min(MAX_PROMPT_BYTES, len(text)))
    prompt_length = st.slider("Prompt: the text's first … bytes", 1, hi, value=qp_int("p", min(generation.DEFAULT_PROMPT_BYTES, hi), 1, hi), key="w_p",
                              help=f"At most {MAX_PROMPT_BYTES:,} bytes. A prompt shorter than the training length "
                                   f"({train_length:,}) lets you watch the context pass it.")
sync_url(p=prompt_length)

ids = text.ids.tolist()
prompt = ids[:prompt_length]
from_document = st.session_state.get("w_src") == "doc"
real = ids[prompt_length:prompt_length + new_bytes] if from_document else []
try:
    settings = generation.DecodeSettings(int(new_bytes), temperature=0.0 if decode == "greedy" else float(temperature),
                                         top_k=int(top_k), seed=int(seed), strategy=strategy)
    generation.check_prompt(prompt)
except PosvizError as exc:
    error_box(exc)
    st.stop()
with st.expander(f"Prompt ({len(prompt):,} bytes)", expanded=False):
    st.code(bytes(prompt).decode("utf-8", errors="replace"), language=None, wrap_lines=True)

# ------------------------------------------------------------------------------------------------
# Write, streaming the bytes to the page (results are kept: moving another widget does not rewrite)
# ------------------------------------------------------------------------------------------------
st.subheader("Side by side")
marker = (f"the context passes the training length ({train_length:,} bytes): this byte is the first predicted "
          f"from more than {train_length:,} bytes")
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
            st.markdown(f"**{name}**")
            slots[name] = {"stats": st.empty(), "note": st.empty(), "text": st.empty()}

pending = [name for name in chosen if name not in results]
if pending:
    decoders = {}
    for name in pending:
        try:
            decoders[name] = generation.Decoder(models[name], prompt, settings)
        except PosvizError as exc:
            slots[name]["note"].error(str(exc), icon="🚫")
    # Bytes between page updates: often enough to watch; each update resends every byte so far, and at 24
    # the updates of two models (75 for 900 bytes) cost the browser more than the writing.
    REFRESH = 64
    written = 0
    started = time.perf_counter()
    with heavy_turn(f"Writing with {', '.join(decoders)}…"):  # the server's work queue: one heavy job at a time
        while any(not d.done for d in decoders.values()):
            for name, decoder in decoders.items():
                decoder.step()
            written += 1
            if written % REFRESH == 0:
                for name, decoder in decoders.items():
                    slots[name]["text"].code(bytes(decoder.generated).decode("utf-8", errors="replace") + "▌",
                                             language=None, wrap_lines=True)
                    rate = len(decoder.generated) / decoder.seconds if decoder.seconds else 0.0
                    slots[name]["stats"].caption(f"{len(decoder.generated):,} / {new_bytes:,} bytes · {rate:,.0f} bytes/s")
    for name, decoder in decoders.items():
        results[name] = decoder.result()
        store_result("generation", keys[name], results[name])

top = 8.0 if colour_by == "surprisal" else 6.0
for name in chosen:
    if name not in results:
        continue
    r = results[name]
    own = f"{r.mean_bits:.2f} bits/byte on its own text" if r.ids else "nothing written"
    rate = f"{r.bytes_per_second:,.0f} bytes/s" if r.ids else "— bytes/s"
    slots[name]["stats"].caption(f"{len(r.ids):,} bytes · {rate} · {own}"
                                 + ("" if models[name].is_absolute else " · true positions (not an absolute method)"))
    if r.error:
        slots[name]["note"].warning(f"**{name}** stopped: {r.error}", icon="⚠️")
    values = r.surprisal if colour_by == "surprisal" else r.entropy
    past = r.first_past_train_length
    chars = lab_inputs.characters_with_bits(r.ids[:past], values[:past])
    mark = len(chars) if past < len(r.ids) else None
    chars += lab_inputs.characters_with_bits(r.ids[past:], values[past:])
    with slots[name]["text"].container():
        show_coloured_text(chars, top=top, unit=f"bits of {colour_by}", height=360, mark_at=mark, mark_label=marker)
        with st.expander("Plain text"):
            st.code(r.text, language=None, wrap_lines=True)

done = {n: results[n] for n in chosen if n in results}
if not done:
    st.stop()

# ------------------------------------------------------------------------------------------------
# The real continuation, teacher-forced
# ------------------------------------------------------------------------------------------------
if from_document and real:
    st.subheader("Its own text against the document's real continuation")
    rows, notes = [], []
    for name in done:
        model = models[name]
        try:
            forced = compute_once(
                "teacher_forced", model.key + (bytes(prompt), bytes(real), strategy),
                lambda progress, model=model: generation.teacher_forced(model, prompt, real, strategy),
                f"{name}: scoring the real continuation…")
        except PosvizError as exc:
            error_box(exc)
            continue
        rows.append({"checkpoint": name, "bits/byte, its own text": done[name].mean_bits,
                     "bits/byte, the real continuation": forced.mean_bits, "bytes scored": len(forced.ids)})
        if forced.error:  # below the table, whole: a table cell cut it off
            notes.append(f"**{name}**: {forced.error}")
    if rows:
        table = pd.DataFrame(rows).set_index("checkpoint")
        numbers = ["bits/byte, its own text", "bits/byte, the real continuation"]
        table[numbers] = table[numbers].astype(float)  # a model that wrote nothing has NaN, shown as "—"
        st.dataframe(table.style.format({"bits/byte, its own text": "{:.3f}", "bits/byte, the real continuation": "{:.3f}"},
                                        na_rep="—"), width="stretch", height="content")
        for note in notes:
            st.caption(note)
        st.caption("The real continuation is read through the same cache and window strategy, one byte at a time "
                   "(teacher forcing). A model's own text is usually cheaper for it than the real one: it wrote "
                   "what it found likely.")

# ------------------------------------------------------------------------------------------------
# Entropy per position window
# ------------------------------------------------------------------------------------------------
width = max(8, train_length // 4)
rows = [{"checkpoint": name, "position": w["window start"], **w}
        for name, r in done.items() for w in generation.window_means(r.entropy, r.prompt_length, width)]
if rows:
    df = pd.DataFrame(rows)
    colours, dashes = method_scales(list(done))
    lines = alt.Chart(df).mark_line(point=True).encode(
        x=alt.X("position:Q", title=f"position in the text (windows of {width} bytes)"),
        y=alt.Y("mean:Q", title="mean entropy of the next byte (bits)", scale=alt.Scale(zero=False)),
        color=alt.Color("checkpoint:N", scale=colours, title="checkpoint"),
        strokeDash=alt.StrokeDash("checkpoint:N", scale=dashes, title="checkpoint"),
        tooltip=["checkpoint", "window start", "window end", alt.Tooltip("mean:Q", format=".3f"), "bytes"])
    rule = alt.Chart(pd.DataFrame({"position": [train_length]})).mark_rule(color="grey", strokeDash=[4, 3]).encode(
        x="position:Q")
    show_chart(alt.layer(lines, rule).properties(height=300), df, f"generation-entropy-{strategy}-n{new_bytes}",
               f"Grey line: the training length ({train_length:,}). A model that no longer knows where it is "
               "usually becomes unsure (entropy up) or stuck in a loop (entropy down to 0).")

# ------------------------------------------------------------------------------------------------
# Export
# ------------------------------------------------------------------------------------------------
texts = "\n\n".join(f"=== {name} ({results[name].strategy}, {len(results[name].ids):,} bytes) ===\n{results[name].text}"
                    for name in done)
per_byte = pd.DataFrame([row for name, r in done.items() for row in generation.per_byte_rows(name, r)])
c1, c2 = st.columns(2)
c1.download_button("Texts (plain text)", texts.encode("utf-8"), file_name="generation.txt", mime="text/plain",
                   key="dl-texts")
c2.download_button("Per-byte numbers (CSV)", per_byte.to_csv(index=False).encode(), file_name="generation.csv",
                   mime="text/csv", key="dl-csv")

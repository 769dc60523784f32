"""Evaluation: bits per byte vs length, per-position loss, sliding windows and a copy-distance probe.

``python -m posviz.evaluate --checkpoint models/rope --lengths 256 512 ... --write`` prints a table and
stores the results in the checkpoint's metrics.json under "eval".
"""
from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path
from typing import Iterable

import numpy as np
import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from posviz.errors import PosvizError, PositionLimitError
from posviz.training.data import as_id_tensor
from posviz.labs.scoring import LN2, bits_per_byte, check_length, position_losses, sliding_window_bpb  # noqa: F401 (the scorer's home)
from posviz.models.byte_gpt import GPT
from posviz.models.interface import LabModel
from posviz.models.shipped import as_lab_model
from posviz.labs.key_value import key_value_probe
from posviz.positions.rope_remaps import ROPE_REMAPS
from posviz.labs.probes import as_rows, copy_probe, default_gaps, held_out, induction_scores, repeat_probe

DEFAULT_EVAL_BYTES = 1 << 17  # 131,072 bytes: every length scores the same bytes of text



def evaluate_probes(model: LabModel, text, train_length: int, chunks: int = 16, seed: int = 0) -> dict:
    """The "retrieval" block of a checkpoint's metrics.json: all three probes at the ``default_gaps`` the
    held-out text is long enough for."""
    text = held_out(text, model)
    gaps = [g for g in default_gaps(train_length) if 2 * (64 + g) + 2 <= text.numel()]
    induction = induction_scores(model, text, gaps, chunks=max(4, chunks // 2), seed=seed)
    return {
        "gaps": gaps,
        "repeat": as_rows(repeat_probe(model, text, gaps, chunks=chunks, seed=seed), gaps),
        "key_value": as_rows(key_value_probe(model, text, gaps, trials=chunks, seed=seed), gaps),
        "induction": {str(g): (None if s is None else np.round(s, 4).tolist()) for g, s in induction.items()},
    }










def eval_table(model: GPT, data, lengths: Iterable[int], progress: bool = True) -> dict[str, float | None]:
    """{length: bpb}; None where the method cannot represent the positions (learned past its table)."""
    return eval_tables(model, data, lengths, progress)[0]


def eval_tables(model: GPT, data, lengths: Iterable[int], progress: bool = True) -> tuple[dict, dict]:
    """({length: bpb}, {length: [bits per byte of each non-overlapping window, in text order]}): the second is
    what a bootstrap over the windows resamples (``posviz_tools.report``); its mean is the first. None (and no
    windows) where the method cannot represent the positions (learned past its table)."""
    table, windows = {}, {}
    for length in lengths:
        try:
            per_window = position_losses(model, data, int(length), progress=progress).mean(dim=1) / LN2  # (W,)
        except PositionLimitError:
            table[str(length)] = None
            continue
        table[str(length)] = round(float(per_window.mean()), 4)
        windows[str(length)] = [round(float(v), 4) for v in per_window]
    return table, windows


@torch.inference_mode()
def scaling_factors(name: str, length: int, train_length: int) -> float | None:
    """The factor each RoPE scaling is evaluated at for ``length``: the stretch L / train_length for
    the static ones; dynamic NTK adapts by itself, so it runs at its usual factor 2 throughout."""
    if length <= train_length:
        return None
    return 2.0 if name == "dynamic" else length / train_length


SINK_WINDOW, SINK_COUNT, SINK_IDS = 128, 4, 1024  # StreamingLLM's 4 sinks, a window of half the training length
SINK_DOCUMENTS = 4  # held-out files whose first 256 bytes give the share on the first byte


def sinks_of_texts(model, documents, stream, first_byte: int | None = None) -> dict:
    """``sinks_block`` on the held-out texts, each starting with ``first_byte`` when given (the beginning-of-text
    experiment: a model trained with ``first_byte`` sees its texts as it was trained)."""
    if first_byte is not None:
        if not 0 <= first_byte < 256:
            raise SystemExit(f"error: --first-byte must be a byte (0..255), got {first_byte}")
        documents = [bytes([first_byte]) + bytes(d) for d in documents]
        stream = np.concatenate(([first_byte], np.asarray(stream)[:-1])).astype(np.asarray(stream).dtype)
    return sinks_block(model, documents, stream)


@torch.inference_mode()
def sinks_block(model, documents, stream) -> dict:
    """Attention sinks, measured: each head's mean share of attention on a document's first byte (queries at 64
    and beyond, ``labs.kv_cache.first_id_share``, over ``SINK_DOCUMENTS`` documents), the weight each layer's
    rows leave unspent (learned sinks; 0 for a softmax, and for stick-breaking, whose remainder stays with the query), and cached decoding of ``SINK_IDS``
    bytes of ``stream`` through a ``SINK_WINDOW``-byte window with ``SINK_COUNT`` StreamingLLM sinks and with none."""
    from posviz.labs.kv_cache import SINK_QUERIES_FROM, first_id_share, streaming_comparison
    from posviz.models.shipped import as_lab_model

    lab = model if isinstance(model, LabModel) else as_lab_model(model)
    start = time.perf_counter()
    docs = [torch.tensor(list(d[:256]), dtype=torch.long) for d in documents if len(d) > 2 * SINK_QUERIES_FROM][:SINK_DOCUMENTS]
    shares = [first_id_share(lab, d) for d in docs]  # attention layers only
    share = np.mean([[r["share"] for r in rows] for rows in shares], axis=0)  # (attention layers * heads,) layer-major
    spent = np.mean([lab.attention_all_layers(d)[:, :, SINK_QUERIES_FROM:].sum(-1).mean((1, 2)).cpu().numpy()
                     for d in docs], axis=0)  # (L,) each layer's mean row sum
    # A sink is a share of softmax attention: a recurrent layer's map is its implied matrix (signed, rows not summing
    # to one), so its layer's entries are None (LabModel.layer_kind), not a share that means something else.
    attends = [lab.layer_kind(layer) == "attention" for layer in range(lab.n_layer)]
    left = [round(1 - float(v), 4) if attends[i] else None for i, v in enumerate(spent)]
    H = lab.n_head
    by_layer = iter(share.reshape(-1, H))
    streaming = streaming_comparison(lab, as_id_tensor(stream)[:SINK_IDS], SINK_WINDOW, SINK_COUNT, SINK_IDS)
    return {"first_byte_share": [[round(float(v), 4) for v in next(by_layer)] if attends[i] else None
                                 for i in range(lab.n_layer)],
            "uniform_share": round(shares[0][0]["uniform"], 4), "documents": len(docs),
            "weight_left_by_layer": left, "streaming": streaming, "seconds": round(time.perf_counter() - start, 2)}


def evaluate_checkpoint(folder, data, multiples=(1, 2, 4, 8, 16, 32), copy_gaps=(0, 16, 64, 128, 192, 512, 1024, 2048),
                        progress: bool = True, validation=None, probe_chunks: int = 16, device="cpu",
                        documents=None) -> dict:
    """The full "eval" block of a checkpoint's metrics.json: bpb vs length, the copy probe and, for
    rope, every inference scaling. Lengths too long for the data are skipped. ``validation``: the
    whole validation split, scored at train_length as well (the headline quality number). ``documents``: held-out
    files for the attention-sink block (``sinks_block``)."""
    from posviz.models.checkpoint_files import load_checkpoint
    from posviz.positions.rope_scaling import ROPE_SCALINGS

    from posviz.models.checkpoint_files import read_config

    model = load_checkpoint(folder, device=device)
    L = model.config.train_length
    finetuned = read_config(folder).get("finetuned_from")
    # A fine-tuned checkpoint is scored at the lengths of the one it came from (multiples of *its* training
    # length), so "before" and "after" and every other checkpoint share one x axis.
    base_folder = base_folder_of(folder, finetuned) if finetuned else None
    L_ref = read_config(base_folder)["model"]["train_length"] if finetuned else L
    data = as_id_tensor(data)
    lengths = [int(m * L_ref) for m in multiples if int(m * L_ref) <= data.numel()]
    (table, windows), seconds = timed(eval_tables, model, data, lengths, progress)
    block = {"nonoverlapping_bpb": table, "nonoverlapping_window_bpb": windows,
             "lengths_x_train": {str(n): n / L for n in lengths}, "eval_bytes": int(data.numel()),
             "seconds": round(seconds, 2)}
    if validation is not None:
        block["validation_split_bpb"] = round(bits_per_byte(model, validation, L, progress=progress), 4)
    block["copy_probe"] = copy_probe(as_lab_model(model), data, [g for g in copy_gaps if 64 + g < data.numel()])
    block["retrieval"] = retrieval_block(model, data if validation is None else validation, probe_chunks, L_ref)
    if documents:
        block["sinks"] = sinks_block(model, documents, data)
    if finetuned:  # the same lengths, the same position options, the weights before fine-tuning
        # a recalibration without its base's positions (DroPE) is set against its base as that was: rope as trained
        base = load_checkpoint(base_folder, None if finetuned.get("dropped_positions") else model.config.position_options,
                               device=device)
        block["before_finetuning"] = {"checkpoint": finetuned["checkpoint"],
                                      "nonoverlapping_bpb": eval_table(base, data, lengths, progress)}
        if finetuned.get("dropped_positions"):  # DroPE's middle stage: the base's weights, positions gone, untrained
            block["before_recalibration"] = before_recalibration(model, base, finetuned["checkpoint"], data, lengths,
                                                                 progress)
    if model.config.position == "rope" and not finetuned:  # inference-time scalings of the pre-trained one
        block["rope_scalings"] = {name: scaling_block(folder, name, data, lengths, L, progress, device)
                                  for name in ROPE_SCALINGS if name != "none"}
    # the training-free remaps, up to 16x, of a RoPE checkpoint (a layout's rotary layers take them too: on request,
    # python -m posviz.evaluate --scaling NAME, as the fine-tunes)
    if model.position.takes_remaps and model.position.at_layer(0) is model.position and not finetuned:
        block["rope_remaps"] = {name: remap_block(folder, name, data, [n for n in lengths if n <= 16 * L], L,
                                                  progress, device) for name in ROPE_REMAPS}
    block["effective_length"] = effective_lengths(folder, data if validation is None else validation, device)
    return block


def base_folder_of(folder, finetuned: dict) -> Path:
    """The folder of the checkpoint ``folder`` was fine-tuned from (its config's ``finetuned_from``)."""
    base_folder = Path(finetuned["checkpoint"])
    if not base_folder.is_absolute():  # recorded as given ("models/rope"): a sibling of this checkpoint
        base_folder = Path(folder).parent / base_folder.name
    return base_folder


def before_recalibration(model, base, checkpoint: str, data, lengths, progress: bool = True) -> dict:
    """A recalibration's (DroPE's) starting point as ``eval.before_recalibration`` stores it: the weights of ``base``
    run as ``model``'s method (nope: the rotation removed) before any step of recalibration, at ``lengths``. What
    the paper's recalibration recovers from (Gelberg et al. 2025 show the loss of a model that merely drops RoPE)."""
    from posviz.models.byte_gpt import GPT

    dropped = GPT(model.config).to(next(base.parameters()).device).eval()
    dropped.load_state_dict(base.state_dict())  # the train step's own carry-over (posviz.training.train)
    return {"checkpoint": checkpoint, "nonoverlapping_bpb": eval_table(dropped, as_id_tensor(data), lengths, progress)}


def scaling_block(folder, name: str, data, lengths, train_length: int, progress: bool = True, device="cpu") -> dict:
    """The rope checkpoint in ``folder`` under the inference-time scaling ``name``: bits per byte at each of
    ``lengths`` at its factor there (``scaling_factors``), as ``eval.rope_scalings[name]`` stores it."""
    from posviz.models.checkpoint_files import load_checkpoint

    row, factors = {}, {}
    for n in lengths:
        factor = scaling_factors(name, n, train_length)
        if factor is None:
            continue
        scaled = load_checkpoint(folder, {"scaling": name, "factor": factor}, device=device)
        row[str(n)] = round(bits_per_byte(scaled, as_id_tensor(data), n, progress=progress), 4)
        factors[str(n)] = factor
    return {"nonoverlapping_bpb": row, "factor": factors}


EFFECTIVE_LENGTH_FACTOR = 16.0  # a scaling's or remap's effective length is probed as configured for 16x


def remap_block(folder, name: str, data, lengths, train_length: int, progress: bool = True, device="cpu") -> dict:
    """The RoPE checkpoint in ``folder`` under the remap ``name``: bits per byte at each of ``lengths`` with the
    remap's defaults covering that length (each its own options, stored beside), as ``eval.rope_remaps[name]``."""
    import dataclasses

    from posviz.models.checkpoint_files import load_checkpoint

    row, options = {}, {}
    for n in lengths:
        factor = max(1.0, n / train_length)
        remapped = load_checkpoint(folder, {"remap": name, "factor": factor}, device=device)
        row[str(n)] = round(bits_per_byte(remapped, as_id_tensor(data), n, progress=progress), 4)
        options[str(n)] = dataclasses.asdict(remapped.position.remap_options)
    return {"nonoverlapping_bpb": row, "options": options}


def effective_lengths(folder, text, device="cpu") -> dict:
    """{"": the checkpoint's own effective length block, and for a RoPE checkpoint one per scaling and remap at
    ``EFFECTIVE_LENGTH_FACTOR``}: what ``eval.effective_length`` stores."""
    from posviz.labs.key_value import effective_length_block
    from posviz.models.interface import open_model
    from posviz.positions.rope_scaling import ROPE_SCALINGS

    model = open_model(folder, device=device)
    out = {"as_trained": effective_length_block(model, text)}
    if model.method == "rope" and not model.finetuned_from():
        for scaling in [s for s in ROPE_SCALINGS if s != "none"]:
            factor = 2.0 if scaling == "dynamic" else EFFECTIVE_LENGTH_FACTOR  # as the scalings' curves are run
            out[scaling] = effective_length_block(open_model(folder, {"scaling": scaling, "factor": factor}, device), text)
        for remap in model.remaps:
            out[remap] = effective_length_block(
                open_model(folder, {"remap": remap, "factor": EFFECTIVE_LENGTH_FACTOR}, device), text)
    return out


def retrieval_block(model: GPT, text, chunks: int = 16, reference_length: int | None = None) -> dict:
    """The far-context probes (``posviz.labs.probes``) for metrics.json, with the seconds they took; gaps
    are multiples of ``reference_length`` (default: the model's training length)."""
    block, seconds = timed(evaluate_probes, as_lab_model(model), text, reference_length or model.config.train_length,
                           chunks=chunks)
    return {**block, "held_out_bytes": int(np.asarray(text).size), "seconds": round(seconds, 1)}


def timed(fn, *args, **kw):
    start = time.perf_counter()
    value = fn(*args, **kw)
    return value, time.perf_counter() - start


def published_eval_table(model, ids: torch.Tensor, lengths: Iterable[int], progress: bool = True) -> dict:
    """{length: bpb} of any LabModel on ``ids`` (its own ids), bits per *byte* through ``bytes_per_id`` so a
    tokenizer's numbers compare with the byte checkpoints'; None where the model cannot run the length."""
    table = {}
    for length in lengths:
        length = int(length)
        if length + 1 > ids.numel() or model.cannot_run(length):
            table[str(length)] = None
            continue
        try:
            losses = position_losses(model, ids, length, batch_tokens=max(length, 1 << 13), progress=progress)  # (W, L)
        except PositionLimitError:
            table[str(length)] = None
            continue
        predicted = model.bytes_per_id(ids[1 : losses.numel() + 1])
        table[str(length)] = round(float(losses.sum(dtype=torch.float64)) / LN2 / float(predicted.sum()), 4)
    return table


def print_streaming(model, ids, window: int, sinks: int, n_ids: int) -> None:
    """``--window W --sinks K``: bits per byte of cached decoding through W ids, with K sinks and with none."""
    from posviz.labs.kv_cache import streaming_comparison

    try:
        r = streaming_comparison(model, ids, window, sinks, n_ids)
    except PosvizError as exc:
        raise SystemExit(f"error: {exc}")
    print(f"{model.name}: {model.method}, trained context {model.train_length:,} {model.unit}s; cached decoding of "
          f"{r['with_sinks']['n_scored'] + 1:,} {model.unit}s through a window of {window:,}")
    print(f"{'':>22} {'bits/byte':>10} {'after the first eviction':>26}")
    for label, key in ((f"with {sinks} sinks", "with_sinks"), ("without sinks", "without")):
        row = r[key]
        if row["error"]:
            print(f"{label:>22} {'cannot run':>10}  {row['error']}")
        else:
            print(f"{label:>22} {row['bpb']:>10.4f} {row['bpb_after_eviction'] if row['bpb_after_eviction'] is None else round(row['bpb_after_eviction'], 4):>26}")
    print(json.dumps(r))


def parse_options(pairs: list[str]) -> dict:
    """``--option KEY=VALUE`` pairs as a dict: numbers as numbers, true/false as booleans, the rest as text (the
    method's options then reject an unknown key or a wrong type with a message)."""
    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise SystemExit(f"error: --option takes KEY=VALUE, got {pair!r}")
        text = value.strip()
        parsed: object = text
        if text.lower() in ("true", "false"):
            parsed = text.lower() == "true"
        else:
            for kind in (int, float):
                try:
                    parsed = kind(text)
                    break
                except ValueError:
                    pass
        out[key.strip()] = parsed
    return out


def resolved_remap(name: str, options: dict, train_length: int, factor: float) -> dict:
    """Every parameter of the remap ``name`` as it runs at ``factor`` x ``train_length`` (the defaults filled in)."""
    return ROPE_REMAPS[name].settings(options, train_length, round(max(1.0, factor) * train_length))


def effective_length_of(model, text, args, remap: bool) -> dict:
    """``--effective-length``: {"model", "variant", "unit", "train_length", "effective_length" (a multiple of the
    trained context, or None), "effective_ids" (it in the model's own ids), "reason", "gain_at_1x", "gains" (per
    multiple, the bits per byte a planted pair saves), "rows"}: the probe and rule of a checkpoint's
    ``eval.effective_length``, for any model. A remap's defaults cover the longest multiple probed (or --factor)."""
    from posviz.labs.key_value import effective_length_block
    from posviz.limits import EFFECTIVE_LENGTH_MULTIPLES

    multiples = [int(m) if float(m).is_integer() else m for m in args.multiples]
    if multiples == [1, 2, 4, 8, 16, 32]:  # the length table's default: the probe's own multiples instead
        multiples = list(EFFECTIVE_LENGTH_MULTIPLES)
    if remap:
        model = model.with_position_options({"factor": args.factor or float(max(multiples))})
    block = effective_length_block(model, text, multiples=multiples, trials=args.trials)
    multiple = block.get("multiple")
    return {"model": model.name, "variant": args.scaling or "as_trained", "unit": model.unit,
            "train_length": model.train_length, "effective_length": multiple,
            "effective_ids": None if multiple is None else int(multiple * model.train_length),
            "reason": block.get("reason"), "gain_at_1x": block.get("gain_at_1x"),
            "gains": {k: (None if row is None else row["gain"]) for k, row in block["rows"].items()},
            "rows": block["rows"]}


def main(argv=None) -> None:
    from posviz.models.checkpoint_files import read_metrics, write_metrics
    from posviz.models.shipped import CheckpointKind
    from posviz.training.data import load_corpus
    from posviz.models.interface import open_model
    from posviz.limits import add_device_argument, resolve_device

    ap = argparse.ArgumentParser(description="Evaluate a model: bits per byte vs evaluation length, and the copy probe. "
                                             "A shipped checkpoint, a checkpoint folder, a folder holding a "
                                             "transformers model, or a Hugging Face hub id (owner/name).")
    ap.add_argument("--checkpoint", required=True, help="e.g. models/alibi, rope, models/hf/rope-neox, openai-community/gpt2")
    ap.add_argument("--multiples", type=float, nargs="+", default=[1, 2, 4, 8, 16, 32],
                    help="evaluation lengths as multiples of the trained context (in the model's own ids)")
    ap.add_argument("--eval-bytes", type=int, default=DEFAULT_EVAL_BYTES)
    ap.add_argument("--scaling", default=None,
                    help="RoPE scaling (linear, ntk, dynamic, yarn, llama3, longrope) or training-free remap "
                         "(self_extend, rerope, leaky_rerope, dca, string) to apply (RoPE models only)")
    ap.add_argument("--factor", type=float, default=None,
                    help="the scaling's factor; for a remap, the multiple of the trained context its defaults cover "
                         "(omitted: each evaluated length's own multiple, so every length is covered)")
    ap.add_argument("--option", action="append", default=[], metavar="KEY=VALUE",
                    help="one of the scaling's or remap's parameters (repeatable), e.g. group=8 window=64 for self_extend; "
                         "without --scaling, one of the method's own options at inference, e.g. "
                         "temperature_floor_scale=8 on nope (Llama 4's query temperature)")
    ap.add_argument("--sliding", type=int, nargs=2, metavar=("WINDOW", "STRIDE"), default=None)
    ap.add_argument("--copy-gaps", type=int, nargs="*", default=[0, 16, 64, 128, 192, 512, 1024, 2048])
    ap.add_argument("--window", type=int, default=None,
                    help="instead of the length table: cached decoding through a window of this many ids, with "
                         "--sinks StreamingLLM sinks and with none")
    ap.add_argument("--sinks", type=int, default=4, help="with --window: the first ids kept (StreamingLLM; default 4)")
    ap.add_argument("--window-ids", type=int, default=2048, help="with --window: ids decoded (default 2,048)")
    ap.add_argument("--sinks-block", action="store_true",
                    help="instead of the length table: the attention-sink measures of eval.sinks (share on the first "
                         "byte per head, weight left unspent, cached decoding with and without StreamingLLM sinks)")
    ap.add_argument("--first-byte", type=int, default=None, metavar="B",
                    help="with --sinks-block: every text starts with byte B (the beginning-of-text experiment: a "
                         "model trained with --set first_byte=B)")
    ap.add_argument("--effective-length", action="store_true",
                    help="instead of the length table: the effective context length (the planted-pair probe and "
                         "rule of eval.effective_length, at --multiples of the trained context, in the model's own "
                         "ids), printed as one JSON line; with --scaling, under that scaling or remap")
    ap.add_argument("--trials", type=int, default=None,
                    help="with --effective-length: planted pairs per depth and length (default: the checkpoints' 8)")
    ap.add_argument("--write", action="store_true", help="store the results in the checkpoint's metrics.json")
    ap.add_argument("--corpus", default=None, help="folder of text files instead of the standard library")
    add_device_argument(ap)
    args = ap.parse_args(argv)

    remap = args.scaling in ROPE_REMAPS
    options = parse_options(args.option)
    if remap:
        overrides = {"remap": args.scaling, "remap_options": options}
    elif args.scaling:
        overrides = {"scaling": args.scaling, "factor": args.factor or 1.0, **options}
    else:  # the method's own options at inference (NoPE's temperature on the nope checkpoint): never dropped unread
        overrides = options
    try:
        model = open_model(args.checkpoint, {} if remap else overrides, device=resolve_device(args.device))
        model.load()
        if remap:
            if args.scaling not in model.remaps:
                why = getattr(model, "remap_refusal", None) or (
                    f"it uses {model.method} positions: the remaps move the positions RoPE rotates pairs by")
                raise PosvizError(f"{model.name} cannot take the {args.scaling} remap: {why}")
            model = model.with_position_options(overrides)
    except PosvizError as exc:
        raise SystemExit(f"error: {exc}")
    corpus = load_corpus(args.corpus)
    if args.effective_length:
        print(json.dumps(effective_length_of(model, corpus.validation, args, remap)))
        return
    data = corpus.eval_stream(args.eval_bytes)
    ids = model.encode(data.tobytes())
    L = model.train_length
    if args.window is not None:
        print_streaming(model, ids, args.window, args.sinks, args.window_ids)
        return
    if args.sinks_block:
        print(json.dumps(sinks_of_texts(model, corpus.eval_documents, data, args.first_byte)))
        return
    lengths = [int(round(m * L)) for m in args.multiples]
    if remap:  # a model per length: its defaults cover that length (or the --factor given), never the plain model
        try:
            scaled = {n: model.with_position_options({"factor": args.factor or max(1.0, n / L)}) for n in lengths}
        except PosvizError as exc:
            raise SystemExit(f"error: {exc}")
        table, seconds = timed(lambda: {str(n): published_eval_table(scaled[n], ids, [n])[str(n)] for n in lengths})
        remap_options = {str(n): resolved_remap(args.scaling, options, L, args.factor or n / L) for n in lengths}
    else:
        table, seconds = timed(published_eval_table, model, ids, lengths)
    result = {"nonoverlapping_bpb": table, "eval_bytes": args.eval_bytes, "eval_ids": int(ids.numel()),
              "unit": model.unit, "train_length": L, "seconds": round(seconds, 2)}
    if remap:
        result["remap_options"] = remap_options
    print(f"{model.name}: {model.method}, trained context {L:,} {model.unit}s"
          f"{'  scaling ' + args.scaling + ' x' + str(args.factor) if args.scaling and not remap else ''}"
          f"{'  remap ' + args.scaling + (' covering x' + format(args.factor, 'g') if args.factor else ' covering each length') if remap else ''}")
    if model.decode(ids) != data.tobytes():
        print("note: the tokenizer does not round-trip this text; bits per byte count the bytes its ids stand for")
    print(f"{'length':>8} {'x L':>6} {'bits/byte':>10}")
    for length in lengths:
        v = table[str(length)]
        why = model.cannot_run(length) or (f"the text has {ids.numel():,} {model.unit}s" if length + 1 > ids.numel() else "")
        note = "" if not remap else "  " + ", ".join(f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}"
                                                    for k, v in remap_options[str(length)].items())
        print(f"{length:>8} {length / L:>6.1f} {'cannot run' if v is None else f'{v:.4f}':>10}  {why if v is None else ''}{note}")
    if args.sliding:
        w, s = args.sliding
        head = ids[: 1 << 14]
        bpb = sliding_window_bpb(model, head, w, s, progress=True, id_bytes=model.bytes_per_id(head))
        result["sliding_bpb"] = {f"W={w},s={s}": round(bpb, 4)}
    if args.copy_gaps:
        result["copy_probe"] = copy_probe(model, data, [g for g in args.copy_gaps if 64 + g < data.size])
        print("copy probe (bits/byte on the second copy, by gap):", result["copy_probe"])
    if args.write:
        try:  # a published model (or a folder without one) has no metrics.json to update
            folder = CheckpointKind.folder(args.checkpoint)
            metrics = read_metrics(folder)
        except PosvizError:
            raise SystemExit("error: --write stores into a shipped checkpoint's metrics.json; this model has none")
        key = (f"rope_{args.scaling}" + (f"_x{args.factor:g}" if args.factor else "")) if args.scaling else None
        ev = metrics.setdefault("eval", {})
        if key:
            ev.setdefault("scalings", {})[key] = result
        else:
            ev.update(result)
        write_metrics(folder, metrics)
    print(json.dumps(result))


if __name__ == "__main__":
    main()

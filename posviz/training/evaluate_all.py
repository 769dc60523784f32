"""Evaluate every shipped checkpoint into its metrics.json: ``python -m posviz.evaluate_all``.

Uses ``evaluate.evaluate_checkpoint`` (bpb at 1..32 x train_length, the copy probe, and for rope every
inference scaling) on the same evaluation bytes for every checkpoint.
"""
from __future__ import annotations

import argparse

from posviz.models.checkpoint_files import load_checkpoint, read_config, read_metrics, shipped_checkpoints, write_metrics
from posviz.training.data import load_corpus
from posviz.training.evaluate import (DEFAULT_EVAL_BYTES, EFFECTIVE_LENGTH_FACTOR, base_folder_of, before_recalibration,
                                     effective_lengths, eval_tables, evaluate_checkpoint, remap_block, retrieval_block,
                                     sinks_block)
from posviz.limits import add_device_argument, resolve_device
from posviz.positions.rope_remaps import ROPE_REMAPS


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", nargs="*", default=None, help="checkpoint names (default: all)")
    ap.add_argument("--eval-bytes", type=int, default=DEFAULT_EVAL_BYTES)
    ap.add_argument("--probes-only", action="store_true",
                    help="only (re)run the far-context probes into eval.retrieval; keep the rest of each eval block")
    ap.add_argument("--windows-only", type=float, default=None, metavar="MAX_MULTIPLE",
                    help="only (re)score each window of the length table, up to MAX_MULTIPLE x the training length, "
                         "into eval.nonoverlapping_window_bpb (for the bootstrap intervals); fails where a window's "
                         "mean moves the stored table")
    ap.add_argument("--sinks-only", action="store_true",
                    help="only (re)measure the attention sinks into eval.sinks; keep the rest of each eval block")
    ap.add_argument("--remaps-only", action="store_true",
                    help="only (re)run the training-free RoPE remaps (up to 16x) into eval.rope_remaps of each RoPE "
                         "checkpoint that was not fine-tuned; keep the rest of each eval block")
    ap.add_argument("--effective-only", action="store_true",
                    help="only (re)measure the effective context length into eval.effective_length (and, for rope, "
                         "under each scaling and remap); keep the rest of each eval block")
    ap.add_argument("--recalibration-only", action="store_true",
                    help="only (re)score a recalibrated checkpoint's (DroPE's) base with its positions dropped and no "
                         "recalibration into eval.before_recalibration; keep the rest of each eval block")
    ap.add_argument("--other-recipe", nargs=2, default=None, metavar=("KEY", "RUN"),
                    help="score RUN, a run of the checkpoint's recipe with other settings (another learning rate: "
                         "trained into runs/, never models/), as the checkpoint is scored, into eval.other_recipes.KEY: "
                         "its scores and the settings that differ, not its weights; with --only NAME")
    ap.add_argument("--remap", choices=list(ROPE_REMAPS), default=None,
                    help="with --remaps-only or --effective-only: (re)run this remap alone, keeping every other stored "
                         "result (a change to one remap re-scores what it moves and nothing else)")
    add_device_argument(ap)
    args = ap.parse_args(argv)
    if args.remap and not (args.remaps_only or args.effective_only):
        ap.error("--remap goes with --remaps-only or --effective-only")
    if args.other_recipe and (not args.only or len(args.only) != 1):
        ap.error("--other-recipe scores one run against one checkpoint: name it with --only NAME")
    device = resolve_device(args.device)
    corpus = load_corpus()
    data = corpus.eval_stream(args.eval_bytes)
    for name, folder in shipped_checkpoints().items():
        if args.only and name not in args.only:
            continue
        metrics = read_metrics(folder)
        if args.other_recipe:
            key, run = args.other_recipe
            ev = metrics.setdefault("eval", {})
            ev["other_recipes"] = {**ev.get("other_recipes", {}), key: other_recipe_block(folder, run, data, corpus.validation,
                                                                                        device)}
            write_metrics(folder, metrics)
            print(name, key, ev["other_recipes"][key]["recipe"], ev["other_recipes"][key]["nonoverlapping_bpb"], flush=True)
            continue
        if args.probes_only:
            metrics.setdefault("eval", {})["retrieval"] = retrieval_block(load_checkpoint(folder, device=device), corpus.validation)
            write_metrics(folder, metrics)
            print(name, "retrieval probes:", metrics["eval"]["retrieval"]["seconds"], "s", flush=True)
            continue
        if args.windows_only is not None:
            ev = metrics.setdefault("eval", {})
            L = min(int(n) for n in ev["nonoverlapping_bpb"])  # 1x of the table (a fine-tuned one's: its base's)
            lengths = [int(n) for n in ev["nonoverlapping_bpb"] if int(n) <= args.windows_only * L
                       and str(n) not in ev.get("nonoverlapping_window_bpb", {})]
            table, windows = eval_tables(load_checkpoint(folder, device=device), data, lengths, progress=False)
            for n, v in table.items():  # the windows' mean is the stored number: else the stored one is stale
                stored = ev["nonoverlapping_bpb"][n]
                if (v is None) != (stored is None) or (v is not None and abs(v - stored) > 2e-4):
                    raise SystemExit(f"{name}: {n} bytes score {v} now, {stored} stored; re-evaluate it in full")
            ev["nonoverlapping_window_bpb"] = {**ev.get("nonoverlapping_window_bpb", {}), **windows}
            write_metrics(folder, metrics)
            print(name, "windows:", {n: len(w) for n, w in windows.items()}, flush=True)
            continue
        if args.remaps_only:
            model = load_checkpoint(folder, device=device)
            if (not model.position.takes_remaps or model.position.at_layer(0) is not model.position
                    or read_config(folder).get("finetuned_from")):
                continue
            L, ev = model.config.train_length, metrics.setdefault("eval", {})
            lengths = [int(n) for n in ev["nonoverlapping_bpb"] if int(n) <= 16 * L]
            names = [args.remap] if args.remap else list(ROPE_REMAPS)
            ev["rope_remaps"] = {**ev.get("rope_remaps", {}),  # the others' stored blocks kept, in their order
                                 **{r: remap_block(folder, r, data, lengths, L, progress=False, device=device) for r in names}}
            write_metrics(folder, metrics)
            print(name, "remaps:", {r: ev["rope_remaps"][r]["nonoverlapping_bpb"] for r in names}, flush=True)
            continue
        if args.effective_only:
            ev = metrics.setdefault("eval", {})
            if args.remap:
                block = remap_effective_length(folder, args.remap, corpus.validation, device)
                if block is None:  # as effective_lengths: only a RoPE checkpoint as trained is probed under a remap
                    continue
                ev["effective_length"] = {**ev.get("effective_length", {}), args.remap: block}
                write_metrics(folder, metrics)
                print(name, f"effective length under {args.remap}:", (block["multiple"], block["reason"]), flush=True)
                continue
            ev["effective_length"] = effective_lengths(folder, corpus.validation, device)
            write_metrics(folder, metrics)
            print(name, "effective length:", {k: (b["multiple"], b["reason"]) for k, b in ev["effective_length"].items()},
                  flush=True)
            continue
        if args.recalibration_only:
            tuned = read_config(folder).get("finetuned_from") or {}
            if not tuned.get("dropped_positions"):
                continue
            ev = metrics.setdefault("eval", {})
            ev["before_recalibration"] = before_recalibration(
                load_checkpoint(folder, device=device), load_checkpoint(base_folder_of(folder, tuned), device=device),
                tuned["checkpoint"], data, [int(n) for n in ev["nonoverlapping_bpb"]], progress=False)
            write_metrics(folder, metrics)
            print(name, "before recalibration:", ev["before_recalibration"]["nonoverlapping_bpb"], flush=True)
            continue
        if args.sinks_only:
            metrics.setdefault("eval", {})["sinks"] = sinks_block(load_checkpoint(folder, device=device),
                                                                  corpus.eval_documents, data)
            write_metrics(folder, metrics)
            print(name, "sinks:", metrics["eval"]["sinks"]["streaming"]["sinks_save_bpb"], flush=True)
            continue
        block = evaluate_checkpoint(folder, data, validation=corpus.validation, device=device,
                                    documents=corpus.eval_documents)
        # other recipes' runs are scored apart (--other-recipe): a new evaluation of the checkpoint keeps them
        metrics["eval"] = {**block, **({"other_recipes": metrics["eval"]["other_recipes"]}
                                       if "other_recipes" in metrics.get("eval", {}) else {})}
        write_metrics(folder, metrics)
        print(name, "validation split:", block["validation_split_bpb"], block["nonoverlapping_bpb"],
              "copy:", block["copy_probe"], flush=True)


def other_recipe_block(folder, run, data, validation, device) -> dict:
    """A run of ``folder``'s recipe with other settings (``recipe_differences``: not the seed alone), scored at the
    checkpoint's stored lengths on the same bytes, with the far-context probes, as ``eval.other_recipes`` keeps it:
    the settings that differ (the run's and the checkpoint's), its training curve's end, and its scores."""
    from posviz.training.seeds import recipe_differences

    run_config, shipped_config = read_config(run), read_config(folder)
    differences = recipe_differences(run_config, shipped_config)
    if not differences:
        raise SystemExit(f"{run} is {folder}'s recipe: record another seed with python -m posviz.training.seeds")

    def settings(config) -> dict:  # {"train": {"lr": ...}}: nested, so a doc reads it as other_recipes.KEY.recipe.train.lr
        out: dict = {}
        for path in differences:
            part, _, key = path.partition(".")
            if key:
                out.setdefault(part, {})[key] = config.get(part, {}).get(key)
            else:
                out[part] = config.get(part, {}).get("file_list_sha256") if part == "corpus" else config.get(part)
        return out

    lengths = [int(n) for n in read_metrics(folder)["eval"]["nonoverlapping_bpb"]]
    model = load_checkpoint(run, device=device)
    table, _ = eval_tables(model, data, lengths, progress=False)
    run_metrics = read_metrics(run)
    return {"run": str(run), "recipe": settings(run_config), "checkpoint_recipe": settings(shipped_config),
            "final_train_bpb": run_metrics.get("final_train_bpb"), "train_curve": run_metrics.get("train_curve"),
            "nonoverlapping_bpb": table, "retrieval": retrieval_block(model, validation)}


def remap_effective_length(folder, remap: str, text, device) -> dict | None:
    """``effective_lengths``' block for ``remap`` alone (its defaults covering ``EFFECTIVE_LENGTH_FACTOR`` x the
    training length), or None where that function probes no remap: not RoPE, fine-tuned, or not taking it."""
    from posviz.labs.key_value import effective_length_block
    from posviz.models.interface import open_model

    model = open_model(folder, device=device)
    if model.method != "rope" or model.finetuned_from() or remap not in model.remaps:
        return None
    return effective_length_block(open_model(folder, {"remap": remap, "factor": EFFECTIVE_LENGTH_FACTOR}, device), text)


if __name__ == "__main__":
    main()

"""Train one checkpoint: ``python -m posviz.train --method rope [--tokens N] [--out models/rope]``.

One recipe for every method: the same dims, seed, data order, token budget and schedule, so that the
position method is the only difference between the shipped checkpoints. Runs on CPU or CUDA and,
unchanged, under ``torchrun --nproc_per_node N`` (DistributedDataParallel; gloo on CPU, nccl on GPU):
each rank takes its slice of the same global batch, so the data order does not depend on N.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import platform
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
from tqdm.auto import tqdm

from .checkpoint import load_checkpoint, save_checkpoint
from .config import ModelConfig, require, strict_from_dict
from .data import batch_offsets, get_batch, load_corpus
from .errors import PosvizError
from .evaluate import bits_per_byte
from .model import GPT


@dataclasses.dataclass
class TrainConfig:
    """The shared recipe. Defaults are the shipped checkpoints' recipe."""

    method: str = "rope"
    position_options: dict = dataclasses.field(default_factory=dict)
    n_layer: int = 4
    n_head: int = 4
    n_embd: int = 128
    train_length: int = 256  # bytes per training sequence (the length every method is trained at)
    batch_size: int = 16  # sequences per step: small batches = more steps per byte on a CPU budget
    tokens: int = 14_000_000  # training budget in bytes (= tokens); steps = tokens / (batch * length)
    lr: float = 3e-3  # tiny models tolerate, and need, a high rate to learn in a few thousand steps
    min_lr_ratio: float = 0.1  # cosine decay ends at lr * this
    warmup_steps: int = 100
    weight_decay: float = 0.1  # on matrices only, as in GPT-2/nanoGPT
    grad_clip: float = 1.0
    seed: int = 1337  # fixes both the initial weights and the data order
    eval_bytes: int = 1 << 16  # validation bytes scored at the end (at train_length)
    log_every: int = 50
    corpus: str | None = None  # None: the standard library of this interpreter
    device: str = "auto"  # "auto" = CUDA when present
    autocast_bf16: bool = True  # bfloat16 matmuls: 1.3-1.9x faster here (CUDA, or CPUs with AVX512-BF16)

    def __post_init__(self):
        for name in ("tokens", "batch_size", "train_length", "eval_bytes", "log_every"):
            value = getattr(self, name)
            require(isinstance(value, int) and value > 0, f"{name} must be a positive integer, got {value!r}")
        require(isinstance(self.warmup_steps, int) and self.warmup_steps >= 0,
                f"warmup_steps must be a non-negative integer, got {self.warmup_steps!r}")
        require(isinstance(self.lr, (int, float)) and self.lr > 0, f"lr must be a positive number, got {self.lr!r}")
        require(self.eval_bytes >= self.train_length,
                f"eval_bytes ({self.eval_bytes}) must hold at least one train_length ({self.train_length}) window")

    def model_config(self) -> ModelConfig:
        return ModelConfig(n_layer=self.n_layer, n_head=self.n_head, n_embd=self.n_embd,
                           train_length=self.train_length, position=self.method,
                           position_options=dict(self.position_options))

    @property
    def steps(self) -> int:
        return max(1, self.tokens // (self.batch_size * self.train_length))


def learning_rate(step: int, cfg: TrainConfig) -> float:
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    progress = (step - cfg.warmup_steps) / max(1, cfg.steps - cfg.warmup_steps)
    floor = cfg.lr * cfg.min_lr_ratio
    return floor + 0.5 * (cfg.lr - floor) * (1 + math.cos(math.pi * min(1.0, progress)))


def pick_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def _distributed() -> tuple[int, int, int]:
    """(rank, world size, local rank); starts the process group when launched by torchrun."""
    if "RANK" not in os.environ or "WORLD_SIZE" not in os.environ:
        return 0, 1, 0
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    if not dist.is_initialized():
        dist.init_process_group(backend)
    return dist.get_rank(), dist.get_world_size(), int(os.environ.get("LOCAL_RANK", 0))


def train(cfg: TrainConfig, out: str | Path | None, progress: bool = True) -> dict:
    rank, world, local_rank = _distributed()
    device = pick_device(cfg.device)
    if device.type == "cuda" and world > 1:
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
    require(cfg.batch_size % world == 0, f"batch_size {cfg.batch_size} must be divisible by the {world} processes")

    torch.manual_seed(cfg.seed)
    model = GPT(cfg.model_config()).to(device)
    ddp_model = torch.nn.parallel.DistributedDataParallel(model) if world > 1 else model
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2 and "position" not in n]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2 or "position" in n]
    optim = torch.optim.AdamW([{"params": decay, "weight_decay": cfg.weight_decay},
                               {"params": no_decay, "weight_decay": 0.0}], lr=cfg.lr, betas=(0.9, 0.95))

    corpus = load_corpus(cfg.corpus)
    val = corpus.eval_stream(cfg.eval_bytes)  # too few validation bytes: fail now, not after training
    data_gen = torch.Generator().manual_seed(cfg.seed)  # separate from init: same order for every method
    local = slice(rank * cfg.batch_size // world, (rank + 1) * cfg.batch_size // world)
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=cfg.autocast_bf16)

    curve, start, tokens_seen = [], time.perf_counter(), 0
    bar = tqdm(range(cfg.steps), disable=not progress or rank != 0, desc=f"train {cfg.method}", unit="step")
    for step in bar:
        offsets = batch_offsets(len(corpus.train), cfg.batch_size, cfg.train_length, data_gen)
        x, y = get_batch(corpus.train, offsets[local], cfg.train_length)
        x, y = x.to(device), y.to(device)
        for group in optim.param_groups:
            group["lr"] = learning_rate(step, cfg)
        with autocast:
            logits = ddp_model(x).logits
        loss = torch.nn.functional.cross_entropy(logits.float().view(-1, 256), y.reshape(-1))
        optim.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        optim.step()
        tokens_seen += cfg.batch_size * cfg.train_length
        if step % cfg.log_every == 0 or step == cfg.steps - 1:
            elapsed = time.perf_counter() - start
            logged = loss.detach()
            if world > 1:  # each rank saw its slice: log the loss of the whole global batch, as with one process
                dist.all_reduce(logged)
                logged = logged / world
            bpb = logged.item() / math.log(2)
            curve.append({"step": step, "tokens": tokens_seen, "train_bpb": round(bpb, 4), "seconds": round(elapsed, 1)})
            bar.set_postfix(bpb=f"{bpb:.3f}", tok_s=f"{tokens_seen / elapsed:,.0f}")
    seconds = time.perf_counter() - start

    result = {}
    if rank == 0:
        model.eval()
        extra = {
            "train": dataclasses.asdict(cfg),
            "corpus": corpus.description,
            "trained_on": {"device": str(device), "processes": world, "platform": platform.platform(),
                           "processor": platform.processor() or platform.machine(),
                           "cpu_threads": torch.get_num_threads(), "seconds": round(seconds, 1),
                           "tokens_per_second": round(tokens_seen / seconds)},
            "versions": {"python": sys.version.split()[0], "torch": torch.__version__},
        }
        metrics = {"train_curve": curve, "final_train_bpb": curve[-1]["train_bpb"], "steps": cfg.steps,
                   "tokens": tokens_seen, "parameters": model.num_parameters()}
        if out is not None:
            save_checkpoint(model, out, extra, metrics)
            stored = load_checkpoint(out)  # score the 16-bit weights that ship, not the fp32 ones
            metrics["val_bpb_at_train_length"] = round(bits_per_byte(stored, val, cfg.train_length), 4)
            save_checkpoint(model, out, extra, metrics)
            if progress:
                print(f"{cfg.method}: val {metrics['val_bpb_at_train_length']:.4f} bits/byte at L={cfg.train_length}, "
                      f"{seconds / 60:.1f} min, saved to {out}")
        result = metrics
    if world > 1:
        dist.barrier()
        dist.destroy_process_group()
    return result


def _parse_pairs(items: list[str]) -> dict:
    """KEY=VALUE strings to a dict; values are JSON where they parse (numbers, true, null), else text."""
    out = {}
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep:
            raise SystemExit(f"expected KEY=VALUE, got {item!r}")
        try:
            out[key] = json.loads(raw)
        except json.JSONDecodeError:
            out[key] = raw
    return out


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description="Train one posviz checkpoint with the shared recipe.")
    ap.add_argument("--method", required=True, help="position method name, e.g. rope, alibi, t5")
    ap.add_argument("--out", default=None, help="output folder (default models/<method>)")
    ap.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE",
                    help="override a recipe field, e.g. tokens=100000 n_embd=64 (unknown keys are an error)")
    ap.add_argument("--option", nargs="*", default=[], metavar="KEY=VALUE", help="position method option")
    args = ap.parse_args(argv)
    values = {"method": args.method, **_parse_pairs(args.set)}
    values["position_options"] = _parse_pairs(args.option)
    try:
        cfg = strict_from_dict(TrainConfig, values, "training recipe")
        GPT(cfg.model_config())  # unknown method, bad shape or option: say so before loading any data
        train(cfg, args.out or f"models/{cfg.method}")
    except PosvizError as exc:  # a message for the person at the terminal, not a traceback
        raise SystemExit(f"error: {exc}") from None


if __name__ == "__main__":
    main()

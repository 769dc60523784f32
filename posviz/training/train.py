"""Train one checkpoint with the shared recipe (the command line is ``posviz.training.command_line``).

One recipe for every method: the same dims, seed, data order, token budget and schedule, so that the
position method is the only difference between the shipped checkpoints. Runs on CPU or CUDA and,
unchanged, under ``torchrun --nproc_per_node N`` (DistributedDataParallel; gloo on CPU, nccl on GPU):
each rank takes its slice of the same global batch, so the data order does not depend on N.
"""
from __future__ import annotations

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

from safetensors.torch import load_file, save_file

from posviz.models.checkpoint_files import load_checkpoint, save_checkpoint
from posviz.config import ModelConfig, require
from posviz.training.data import batch_offsets, begin_rows, get_batch, load_corpus, plant_repeats
from posviz.errors import PosvizError
from posviz.training.evaluate import bits_per_byte
from posviz.limits import resolve_device
from posviz.models.byte_gpt import GPT, pinned_config
from posviz.labs.probes import copy_check


PRECISIONS = ("auto", "bf16", "fp32")


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
    # training budget in bytes (= tokens); steps = tokens / (batch * length). 16 M rather than the first
    # set's 14 M: about 14 % of the bytes are planted copies (repeat_probability), which teach less
    tokens: int = 16_000_000
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
    # "auto": bfloat16 autocast on a CUDA GPU that supports it, fp32 elsewhere (a CPU with only AVX2
    # emulates bf16, 7.5x *slower*; ask for "bf16" on one with AVX512-BF16 or AMX); "bf16" or "fp32" to force.
    precision: str = "auto"
    checkpoint_every: int = 200  # steps between saved training states (resume with --resume)
    # Context extension by fine-tuning (Chen et al. 2023; Peng et al. 2023): start from this checkpoint's
    # weights instead of the seed's, at this recipe's train_length and position options. None: pre-train.
    finetune_from: str | None = None
    # Planted repeats (data.plant_repeats): this fraction of training rows gets a span of its own text
    # copied later in the row, so that copying from context pays early.
    # 0.5 since the second set: without planted repeats RoPE and NoPE never learned to copy in this
    # budget (a repeated chunk cost 0.95 of its first sight), so the set could not compare far copying.
    repeat_probability: float = 0.5
    repeat_min_bytes: int = 16
    repeat_max_bytes: int = 128
    # A beginning-of-text id: every training row starts with this byte (its targets shift by one). None, the
    # shipped recipe: rows start anywhere in a file. For the attention-sink experiment (docs/results.md):
    # trained models pour attention on a first token that is always the same (Xiao et al. 2024).
    first_byte: int | None = None

    def __post_init__(self):
        require(self.precision in PRECISIONS, f"precision must be one of {', '.join(PRECISIONS)}, got {self.precision!r}")
        for name in ("tokens", "batch_size", "train_length", "eval_bytes", "log_every", "checkpoint_every"):
            value = getattr(self, name)
            require(isinstance(value, int) and value > 0, f"{name} must be a positive integer, got {value!r}")
        require(isinstance(self.warmup_steps, int) and self.warmup_steps >= 0,
                f"warmup_steps must be a non-negative integer, got {self.warmup_steps!r}")
        require(isinstance(self.lr, (int, float)) and 0 < self.lr <= 10, f"lr must be a number in (0, 10], got {self.lr!r}")
        require(isinstance(self.seed, int) and not isinstance(self.seed, bool) and 0 <= self.seed < 2**63,
                f"seed must be a non-negative integer, got {self.seed!r}")
        for name in ("grad_clip", "weight_decay", "min_lr_ratio"):
            value = getattr(self, name)  # NaN or infinite: every weight NaN after the first step
            require(isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value >= 0,
                    f"{name} must be a finite number >= 0, got {value!r}")
        require(self.grad_clip > 0 and self.min_lr_ratio <= 1, f"grad_clip must be > 0 and min_lr_ratio at most 1, got "
                                                               f"{self.grad_clip!r} and {self.min_lr_ratio!r}")
        require(self.first_byte is None or (isinstance(self.first_byte, int) and 0 <= self.first_byte < 256),
                f"first_byte must be a byte (0..255) or None, got {self.first_byte!r}")
        require(isinstance(self.repeat_probability, (int, float)) and 0 <= self.repeat_probability <= 1,
                f"repeat_probability must be between 0 and 1, got {self.repeat_probability!r}")
        require(isinstance(self.repeat_min_bytes, int) and isinstance(self.repeat_max_bytes, int)
                and 1 <= self.repeat_min_bytes <= self.repeat_max_bytes,
                f"repeat_min_bytes ({self.repeat_min_bytes!r}) and repeat_max_bytes ({self.repeat_max_bytes!r}) "
                "must be integers with 1 <= min <= max")
        # a planted span and its copy must both fit in one row of train_length + 1 bytes
        require(self.repeat_probability == 0 or 2 * self.repeat_min_bytes <= self.train_length + 1,
                f"repeat_min_bytes ({self.repeat_min_bytes}) is too long for train_length {self.train_length}: a span "
                f"and its copy must fit in one row; set repeat_min_bytes <= {(self.train_length + 1) // 2} "
                "or repeat_probability=0")
        require(self.eval_bytes >= self.train_length,
                f"eval_bytes ({self.eval_bytes}) must hold at least one train_length ({self.train_length}) window")

    def model_config(self) -> ModelConfig:
        return ModelConfig(n_layer=self.n_layer, n_head=self.n_head, n_embd=self.n_embd,
                           train_length=self.train_length, position=self.method,
                           position_options=dict(self.position_options))

    @property
    def steps(self) -> int:
        return max(1, self.tokens // (self.batch_size * self.train_length))


# Recipe fields added after checkpoints had trained without them, with the value those runs had in effect. A
# config.json written before a field existed lacks it (it is never filled in later); read, the absence means this.
FIELDS_ADDED_LATER = {"first_byte": None}  # the beginning-of-text experiment; None: rows start anywhere, as always


def as_recorded(recipe: dict) -> dict:
    """A config.json's "train" section as the recipe it was: fields added later read as the value then in effect."""
    return {**FIELDS_ADDED_LATER, **recipe}


def learning_rate(step: int, cfg: TrainConfig) -> float:
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    progress = (step - cfg.warmup_steps) / max(1, cfg.steps - cfg.warmup_steps)
    floor = cfg.lr * cfg.min_lr_ratio
    return floor + 0.5 * (cfg.lr - floor) * (1 + math.cos(math.pi * min(1.0, progress)))


def backend_for(device_name: str) -> str:
    """The process group's backend: NCCL only when training on CUDA (it cannot move CPU tensors, so
    ``--set device=cpu`` on a machine with a GPU needs gloo)."""
    return "nccl" if resolve_device(device_name).type == "cuda" else "gloo"


def _distributed(device_name: str = "auto") -> tuple[int, int, int]:
    """(rank, world size, local rank); starts the process group when launched by torchrun."""
    if "RANK" not in os.environ or "WORLD_SIZE" not in os.environ:
        return 0, 1, 0
    if not dist.is_initialized():
        dist.init_process_group(backend_for(device_name))
    return dist.get_rank(), dist.get_world_size(), int(os.environ.get("LOCAL_RANK", 0))


def precision_rule(asked: str, device: torch.device) -> str:
    """The precision to train in, decided from facts every rank shares, not from a timing.

    "auto": bf16 autocast on a CUDA GPU with bf16 support (there it is the faster kind of matmul), fp32
    elsewhere: whether a CPU gains from bf16 depends on instructions a timing of one small matmul
    judged by chance (and on a GPU such a timing measures launch overhead)."""
    if asked != "auto":
        return asked
    return "bf16" if device.type == "cuda" and torch.cuda.is_bf16_supported() else "fp32"


def pick_precision(cfg: TrainConfig, device: torch.device, world: int = 1) -> dict:
    """The precision to train in, the same on every rank: rank 0's rule, broadcast when there are
    several (ranks on different kinds of device would otherwise train in different precisions)."""
    chosen = precision_rule(cfg.precision, device)
    if world > 1:
        box = [chosen]
        dist.broadcast_object_list(box, src=0, device=device if backend_for(str(device)) == "nccl" else None)
        chosen = box[0]
    return {"precision": chosen, "asked": cfg.precision}


STATE_WEIGHTS, STATE_JSON = "state.safetensors", "state.json"


def state_dir_for(out: str | Path) -> Path:
    """Where a run keeps its resumable state: runs/<name>.state next to nothing that ships."""
    return Path("runs") / f"{Path(out).name}.state"


def save_state(folder: Path, model: GPT, optim: torch.optim.Optimizer, data_gen: torch.Generator, step: int,
               tokens_seen: int, curve: list, seconds: float, cfg: TrainConfig, copy_curve: list | None = None,
               precision: str | None = None) -> None:
    """Everything needed to continue exactly where training stopped, as safetensors + JSON (no pickle).

    Written to a temporary name and renamed, so a run killed while saving keeps its previous state.
    """
    folder.mkdir(parents=True, exist_ok=True)
    tensors = {f"model.{k}": v.detach().cpu().contiguous() for k, v in model.state_dict().items() if k != "lm_head.weight"}
    names = {id(p): n for n, p in model.named_parameters()}
    for group in optim.param_groups:
        for p in group["params"]:
            for key, value in optim.state.get(p, {}).items():
                if torch.is_tensor(value):
                    tensors[f"optim.{names[id(p)]}.{key}"] = value.detach().cpu().contiguous()
    tensors["data_generator"] = data_gen.get_state()
    tmp = folder / (STATE_WEIGHTS + ".tmp")
    save_file(tensors, str(tmp))
    info = {"step": step, "tokens_seen": tokens_seen, "curve": curve, "copy_curve": copy_curve or [], "seconds": seconds,
            "recipe": dataclasses.asdict(cfg), **({"precision": precision} if precision is not None else {})}
    (folder / (STATE_JSON + ".tmp")).write_text(json.dumps(info) + "\n")
    os.replace(tmp, folder / STATE_WEIGHTS)
    os.replace(folder / (STATE_JSON + ".tmp"), folder / STATE_JSON)


def load_state(folder: Path, model: GPT, optim: torch.optim.Optimizer, data_gen: torch.Generator,
               cfg: TrainConfig, precision: str | None = None) -> dict:
    """Restore a saved state into the fresh ``model``, ``optim`` and ``data_gen``; returns state.json.

    precision: the one this run trains in; a state trained in another is refused ("auto" may resolve
    differently on another machine, and mixing precisions in one run gives weights neither would)."""
    info = json.loads((folder / STATE_JSON).read_text())
    changed = recipe_differences(info["recipe"], cfg)
    if changed:
        raise PosvizError(f"the saved state in {folder} was made with another recipe (differs in: {', '.join(changed)}); "
                          "delete that folder to start over, or resume with the same settings")
    saved = info.get("precision")  # states saved before the precision was recorded cannot be checked
    if precision is not None and saved is not None and saved != precision:
        raise PosvizError(f"the saved state in {folder} was trained in {saved} but this run would train in {precision}; "
                          f"resume with --set precision={saved} on a machine that supports it, or delete that folder "
                          "to start over")
    tensors = load_file(str(folder / STATE_WEIGHTS))
    model.load_state_dict({k[len("model."):]: v for k, v in tensors.items() if k.startswith("model.")}, strict=False)
    for name, p in model.named_parameters():  # the optimizer makes its state lazily: fill it by parameter name
        entry = {key.rsplit(".", 1)[1]: v if key.endswith(".step") else v.to(p.device) for key, v in tensors.items()
                 if key.startswith(f"optim.{name}.") and key.count(".") == name.count(".") + 2}
        if entry:
            optim.state[p] = entry
    data_gen.set_state(tensors["data_generator"])
    return info


# Recipe fields a resumed run may change: they do not alter the trained weights.
RESUMABLE_CHANGES = {"log_every", "checkpoint_every", "device"}


def recipe_differences(saved: dict, cfg: TrainConfig) -> list[str]:
    """The recipe fields in which a saved state's recipe differs from ``cfg`` (those that alter the weights)."""
    wanted = {k: v for k, v in dataclasses.asdict(cfg).items() if k not in RESUMABLE_CHANGES}
    saved = {k: v for k, v in saved.items() if k not in RESUMABLE_CHANGES}
    return sorted(k for k in set(saved) | set(wanted) if saved.get(k) != wanted.get(k))


def initial_model(cfg: TrainConfig) -> GPT:
    """The model a run with ``cfg`` starts from, its random draws included: the method's options pinned (which draws
    its parameters once, before the seed, so the model's own draws stay the recipe's), then the seed, then the model.
    The checks before a run (``quick.check_scored_lengths``) check this very model, not another draw of it."""
    model_config = pinned_config(cfg.model_config())
    torch.manual_seed(cfg.seed)
    return GPT(model_config)


class TrainingCancelled(PosvizError):
    """The ``on_step`` callback asked training to stop (the Workshop's Cancel): nothing is saved."""


def drops_positions(start, method: str) -> bool:
    """Whether fine-tuning ``start`` as ``method`` is DroPE (Gelberg et al. 2025, "Extending the Context of Pretrained
    LLMs by Dropping Their Positional Embeddings", https://arxiv.org/abs/2512.12167; SakanaAI/DroPE): the new method is
    nope and the old one holds no weights (RoPE's rotation is computed, not learned), so every weight carries over and
    only the positions are gone."""
    return method == "nope" and not any(True for _ in start.position.state_dict())

def train(cfg: TrainConfig, out: str | Path | None, progress: bool = True, resume: bool = False,
          state_dir: str | Path | None = None, stop_after: int | None = None, on_step=None,
          max_seconds: float | None = None) -> dict:
    """Train with the recipe ``cfg``; save the checkpoint to ``out`` (None: only return the metrics).

    resume: continue from the state saved in ``state_dir`` (default ``runs/<out name>.state``) if there is one.
    stop_after: stop after this many steps of the run, saving the state (what an interrupted run leaves).
    on_step: called after every step with (steps done, steps in all, seconds so far); a true answer cancels the run
    (``TrainingCancelled``): the Workshop's progress bar and Cancel button.
    max_seconds: a hosted demo's cap: past it training ends early, and the checkpoint says at which step
    (metrics["stopped_early"]).
    """
    rank, world, local_rank = _distributed(cfg.device)
    device = resolve_device(cfg.device)
    if device.type == "cuda" and world > 1:
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
    require(cfg.batch_size % world == 0, f"batch_size {cfg.batch_size} must be divisible by the {world} processes")

    # every position option written out as built (a preset's layers, code defaults): the checkpoint stores these,
    # so a later edit of a preset or a default never changes what it loads. Before the seed: building the
    # method alone draws its parameters, and the model's own draws must stay those of the recipe.
    model = initial_model(cfg)
    if cfg.finetune_from is not None:
        start = load_checkpoint(cfg.finetune_from)  # checked: a damaged folder says so here
        require(start.config.position == cfg.method or drops_positions(start, cfg.method),
                f"fine-tuning a {start.config.position!r} checkpoint ({cfg.finetune_from}) as {cfg.method!r}: the "
                "methods must match, or the new one be nope over a method that holds no weights (DroPE: a RoPE model "
                "recalibrated with its rotation removed)")
        model.load_state_dict(start.state_dict())
    # DroPE: the method whose positions this run removed (recorded beside finetuned_from), None otherwise
    dropped = start.config.position if cfg.finetune_from is not None and start.config.position != cfg.method else None
    model = model.to(device)
    ddp_model = torch.nn.parallel.DistributedDataParallel(model) if world > 1 else model
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2 and "position" not in n]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2 or "position" in n]
    optim = torch.optim.AdamW([{"params": decay, "weight_decay": cfg.weight_decay},
                               {"params": no_decay, "weight_decay": 0.0}], lr=cfg.lr, betas=(0.9, 0.95))

    corpus = load_corpus(cfg.corpus)
    val = corpus.eval_stream(cfg.eval_bytes)  # too few validation bytes: fail now, not after training
    data_gen = torch.Generator().manual_seed(cfg.seed)  # separate from init: same order for every method
    local = slice(rank * cfg.batch_size // world, (rank + 1) * cfg.batch_size // world)
    precision = pick_precision(cfg, device, world)
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=precision["precision"] == "bf16")

    curve, tokens_seen, first_step, earlier_seconds = [], 0, 0, 0.0
    copy_curve = []  # the repeat probe at gap 0 at every saved state: when copying from context forms
    state = Path(state_dir) if state_dir is not None else (state_dir_for(out) if out is not None else None)
    if resume and state is not None and (state / STATE_JSON).is_file():
        info = load_state(state, model, optim, data_gen, cfg, precision["precision"])
        first_step, tokens_seen, curve, earlier_seconds = info["step"], info["tokens_seen"], info["curve"], info["seconds"]
        copy_curve = info.get("copy_curve", [])
        if progress and rank == 0:
            print(f"resuming {cfg.method} at step {first_step:,} of {cfg.steps:,} from {state}", flush=True)
    start = time.perf_counter() - earlier_seconds
    bar = tqdm(range(first_step, cfg.steps), initial=first_step, total=cfg.steps,
               disable=not progress or rank != 0, desc=f"train {cfg.method}", unit="step")
    for step in bar:
        offsets = batch_offsets(len(corpus.train), cfg.batch_size, cfg.train_length, data_gen)
        x, y = get_batch(corpus.train, offsets, cfg.train_length)
        x, y = plant_repeats(x, y, cfg.repeat_probability, cfg.repeat_min_bytes, cfg.repeat_max_bytes, data_gen)
        if cfg.first_byte is not None:
            x, y = begin_rows(x, y, cfg.first_byte)
        x, y = x[local], y[local]
        x, y = x.to(device), y.to(device)
        for group in optim.param_groups:
            group["lr"] = learning_rate(step, cfg)
        with autocast:
            logits = ddp_model(x).logits
        loss = torch.nn.functional.cross_entropy(logits.float().view(-1, 256), y.reshape(-1))
        optim.zero_grad(set_to_none=True)
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        # one host sync a step: a NaN or infinite loss makes the norm one too, and a NaN gradient would turn
        # every weight NaN in this step: stop before it
        if not torch.isfinite(norm):
            bad = sorted((n for n, p in model.named_parameters() if p.grad is not None and not torch.isfinite(p.grad).all()),
                         key=lambda n: not n.startswith("position."))  # where it began, most often: the bias's own
            which = f"{bad[0]}{f' (and {len(bad) - 1} more)' if len(bad) > 1 else ''}" if bad else "the weights"
            raise PosvizError(f"training stopped at step {step:,}: the gradient of {which} is not a number. A formula "
                              "method: its bias has no derivative on some pair (sqrt(x) or log(x) at x = 0, a parameter "
                              "times -inf); keep it smooth there, e.g. sqrt(a[h] * d + 1e-6). Otherwise lower lr")
        optim.step()
        model.position.after_optimizer_step()  # a method's own constraint on its stored parameters
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
        done = step + 1
        interrupted = stop_after is not None and done - first_step >= stop_after and done < cfg.steps
        if rank == 0 and done % cfg.checkpoint_every == 0:
            check = copy_check(model, corpus.validation)  # no gradients, no random draws: training is unchanged
            if check is not None:
                copy_curve.append({"step": done, "tokens": tokens_seen, **check})
        if state is not None and rank == 0 and (done % cfg.checkpoint_every == 0 or interrupted):
            save_state(state, model, optim, data_gen, done, tokens_seen, curve, time.perf_counter() - start, cfg,
                       copy_curve, precision["precision"])
        if interrupted:
            return {"stopped_at_step": done, "state": str(state)}
        elapsed = time.perf_counter() - start
        if on_step is not None and on_step(done, cfg.steps, elapsed):
            raise TrainingCancelled(f"training cancelled at step {done:,} of {cfg.steps:,}")
        if max_seconds is not None and elapsed > max_seconds and done < cfg.steps:
            stopped_early = f"stopped at step {done:,} of {cfg.steps:,}: the {max_seconds:.0f} s cap on training"
            break
    else:
        stopped_early = None
    seconds = time.perf_counter() - start

    result = {}
    if rank == 0:
        model.eval()
        extra = {
            "train": dataclasses.asdict(cfg),
            **({"finetuned_from": {"checkpoint": str(cfg.finetune_from), "tokens": cfg.tokens,
                                   "train_length": cfg.train_length, "position_options": dict(cfg.position_options),
                                   **({"dropped_positions": dropped} if dropped else {})}}
               if cfg.finetune_from is not None else {}),
            "corpus": corpus.description,
            "trained_on": {"device": str(device), "processes": world, "platform": platform.platform(),
                           "processor": platform.processor() or platform.machine(),
                           "cpu_threads": torch.get_num_threads(), "seconds": round(seconds, 1), **precision,
                           "tokens_per_second": round(tokens_seen / seconds)},
            "versions": {"python": sys.version.split()[0], "torch": torch.__version__},
        }
        metrics = {"train_curve": curve, "copy_curve": copy_curve, "final_train_bpb": curve[-1]["train_bpb"], "steps": cfg.steps,
                   "tokens": tokens_seen, "parameters": model.num_parameters(),
                   **({"stopped_early": stopped_early} if stopped_early else {})}
        if out is not None:
            save_checkpoint(model, out, extra, metrics)
            stored = load_checkpoint(out, device=device)  # score the 16-bit weights that ship, not the fp32 ones
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

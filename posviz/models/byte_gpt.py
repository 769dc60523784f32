"""A GPT-2-style byte-level decoder whose position method is a constructor argument.

Pre-LayerNorm blocks, GELU MLP, biases, tied input/output embeddings, as in GPT-2. The position
method plugs in at three fixed hooks (see ``positions.base``) and attention never asks which method
it has. Shape legend: B batch, T sequence length (Tq queries, Tk keys), C n_embd, H n_head, hs head
size, V vocab (256 bytes).
"""
from __future__ import annotations
import dataclasses
import math

import torch
import torch.nn.functional as F
from torch import nn

from posviz.config import ModelConfig
from posviz.errors import PosvizError
from posviz.models.attention import CausalSelfAttention
from posviz.models.output import ModelOutput
from posviz.models.kv_cache import KVCache
from posviz.positions import ModelShape, build_position_method
from posviz.positions.base import mark_run, position_range


def _reads_are_free(t: torch.Tensor) -> bool:
    """Whether reading a value of ``t`` costs no wait for a device (the tests pretend it does)."""
    return t.device.type == "cpu"


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.c_fc = nn.Linear(cfg.n_embd, 4 * cfg.n_embd)
        self.gelu = nn.GELU(approximate="tanh")  # GPT-2's "gelu_new", so exports match exactly
        self.c_proj = nn.Linear(4 * cfg.n_embd, cfg.n_embd)

    def forward(self, x, position=None, layer: int = 0, cache=None):
        h = F.linear(x, self.c_fc.weight, self.c_fc.bias)  # (B, T, 4C)
        if position is not None:
            h = position.mix_hidden(layer, "D", h, cache)  # Canon-D: the hidden layer, before its activation
        return F.linear(F.gelu(h, approximate=self.gelu.approximate), self.c_proj.weight, self.c_proj.bias)


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig, attends: bool = True):
        super().__init__()
        self.ln_1 = nn.LayerNorm(cfg.n_embd)
        # attends False: the position method puts a layer of its own in attention's place (``token_mixer``: a recurrent
        # layer), whose weights it holds; an attention here would be weights nothing reads
        self.attn = CausalSelfAttention(cfg) if attends else None
        self.ln_2 = nn.LayerNorm(cfg.n_embd)
        self.mlp = MLP(cfg)

    def forward(self, x, pos, position, layer, cache, want_probs, blocks):
        here = position.at_layer(layer)
        h = here.mix_hidden(layer, "A", self.ln_1(x), cache)  # Canon-A: attention's input (the input unless a method mixes)
        mixer = self.attn if self.attn is not None else here.token_mixer(layer)  # attention, or the method's own layer
        a, probs = mixer(h, pos, position, layer, cache, want_probs, blocks)
        x = x + a
        ln = self.ln_2
        h = here.mix_hidden(layer, "C", F.layer_norm(x, ln.normalized_shape, ln.weight, ln.bias, ln.eps), cache)  # Canon-C
        x = x + self.mlp(h, here, layer, cache)
        return x, probs


def pinned_config(cfg: ModelConfig) -> ModelConfig:
    """``cfg`` with its position options written out as the method builds them (``pinned_options``): what a
    checkpoint stores, so that loading it never reads a code default or a preset again. Builds the method
    alone (its parameters' random draws happen here, so call it before seeding the model's own)."""
    shape = ModelShape(cfg.n_layer, cfg.n_head, cfg.head_dim, cfg.n_embd, cfg.train_length)
    pinned = build_position_method(cfg.position, shape, cfg.position_options).pinned_options()
    return dataclasses.replace(cfg, position_options=pinned)


class GPT(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.config = cfg
        shape = ModelShape(cfg.n_layer, cfg.n_head, cfg.head_dim, cfg.n_embd, cfg.train_length)
        self.position = build_position_method(cfg.position, shape, cfg.position_options)
        self.wte = nn.Embedding(cfg.vocab_size, cfg.n_embd)
        self.blocks = nn.ModuleList(Block(cfg, self.position.at_layer(i).token_mixer(i) is None) for i in range(cfg.n_layer))
        self.ln_f = nn.LayerNorm(cfg.n_embd)
        self.lm_head = nn.Linear(cfg.n_embd, cfg.vocab_size, bias=False)
        self.lm_head.weight = self.wte.weight  # tied, as in GPT-2
        # GPT-2's init for the model's own layers only: the position method initialised its parameters
        # itself, as its paper does (FIRE's MLP under N(0, 0.02) and zero biases starts linear, with
        # half its units dead for good).
        own = set(map(id, self.position.modules()))
        for module in self.modules():
            if id(module) not in own:
                self._init_weights(module)
        for name, p in self.named_parameters():
            if name.endswith("c_proj.weight"):  # GPT-2: scale residual projections by depth
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * cfg.n_layer))

    @staticmethod
    def _init_weights(module):
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)

    @property
    def device(self) -> torch.device:
        return self.wte.weight.device

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def forward(
        self,
        idx: torch.Tensor,
        positions: torch.Tensor | int | None = None,
        cache: KVCache | None = None,
        attention_layer: int | None = None,
        attention_head: int | None = None,
    ) -> ModelOutput:
        """Logits for byte ids ``idx`` (B, T).

        positions: absolute positions (T,), or an int p0 for p0, p0+1, ...; default continues after the
            cache (0.. without one). An int (or the default) lets the pass run without reading a position
            back from the device, where a tensor may need a read or two (a host sync each on a GPU).
        attention_layer: also return that layer's attention probabilities (all heads, or only
            ``attention_head``), computed eagerly for that layer alone; other layers stay fused.
        """
        if idx.dim() != 2 or idx.shape[1] == 0:
            raise PosvizError(f"expected a non-empty batch of byte ids of shape (B, T), got shape {tuple(idx.shape)}")
        if idx.is_floating_point() or idx.dtype == torch.bool or idx.is_complex() or (
                _reads_are_free(idx) and not 0 <= int(idx.min()) <= int(idx.max()) < self.config.vocab_size):
            # The values are checked where reading them costs nothing: on a GPU that read would wait for
            # the device at every pass (every decoded byte). posviz encodes bytes on the CPU and moves
            # them, and a decoding loop feeds back bytes sampled from the 256 logits.
            raise PosvizError(f"byte ids must be integers in 0..{self.config.vocab_size - 1}; encode text with posviz.training.data.encode_text")
        B, T = idx.shape
        query_blocks = {}
        if cache is not None and cache.n_layer != len(self.blocks):
            raise PosvizError(f"the KV cache was made for {cache.n_layer} layers but the model has {len(self.blocks)}")
        if positions is None or isinstance(positions, int):
            start = (0 if cache is None else cache.next_position()) if positions is None else positions
            if start < 0:
                raise PosvizError(f"positions must be {T} non-negative integers (one per byte), got a run from {start}")
            positions = mark_run(torch.arange(start, start + T, device=idx.device), start)
            query_blocks = {"q_run": start}  # these positions are a run: attention need not check
        elif (not isinstance(positions, torch.Tensor) or positions.dim() != 1 or positions.numel() != T
              or positions.is_floating_point() or positions.dtype == torch.bool or position_range(positions)[0] < 0):
            raise PosvizError(f"positions must be {T} non-negative integers (one per byte), got shape "
                              f"{tuple(getattr(positions, 'shape', ()))} of {getattr(positions, 'dtype', type(positions))}")
        self.position.check_positions(positions)
        if attention_layer is not None and not 0 <= attention_layer < len(self.blocks):
            raise PosvizError(f"attention_layer must be in 0..{len(self.blocks) - 1}, got {attention_layer}")
        if attention_head is not None and not 0 <= attention_head < self.config.n_head:
            raise PosvizError(f"attention_head must be in 0..{self.config.n_head - 1}, got {attention_head}")

        x = self.position.add_to_input(self.wte(idx), positions)  # (B, T, C)
        attention = None  # query_blocks: what the layers share, built by the first layer that needs it
        try:
            for layer, block in enumerate(self.blocks):
                x, probs = block(x, positions, self.position, layer, cache, layer == attention_layer, query_blocks)
                if probs is not None:
                    attention = probs if attention_head is None else probs[:, attention_head]
        finally:
            # A bias shared across layers is as large as an attention map (256 MB at 4,096 bytes):
            # let it go with the forward pass instead of keeping one per loaded model.
            self.position.forget()
        ln = self.ln_f
        logits = F.linear(F.layer_norm(x, ln.normalized_shape, ln.weight, ln.bias, ln.eps), self.lm_head.weight)  # (B, T, V)
        return ModelOutput(logits, attention)

    def loss(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        logits = self(idx).logits
        return F.cross_entropy(logits.float().view(-1, logits.shape[-1]), targets.reshape(-1))

"""What a published model says about its positions, as the explore pages draw them: its learned table, its
rotary speeds, its ALiBi slopes as the model adds them, and the notes on where it computes something other than
its paper (``PublishedModel.position``)."""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from posviz.models.hf import probes
from posviz.models.hf.families import alibi_slopes_as_added


@dataclass
class PublishedPositions:
    """A published model's position parameters as the explore pages draw them, read from the model itself."""

    method: str
    family: str
    table: torch.Tensor | None = None  # learned: (rows, C), position 0 first
    inv_freq: torch.Tensor | None = None  # rope: (rotary_dims / 2,) from the model's rotary module
    attention_factor: float = 1.0
    rotary_dims: int | None = None
    head_dim: int | None = None
    slopes: torch.Tensor | None = None  # alibi: (H,) the bias per unit of distance, as the model adds it
    notes: list[str] = field(default_factory=list)  # where the model computes something else than its paper


def published_positions(model) -> PublishedPositions:
    """``model``'s (a ``PublishedModel``) position parameters and notes, read from the model itself."""
    out = PublishedPositions(model.method, model.family_name, head_dim=model.head_dim, rotary_dims=model.rotary_dims)
    if model.method == "learned":
        table = dict(model.net.named_parameters())[model._family.table_name].detach().float().cpu()
        out.table = table[model._family.table_offset:]
        if model._family.table_offset:
            out.notes.append(f"{model.family_name} keeps {model._family.table_offset} rows before position 0 "
                             f"(its table has {table.shape[0]:,} rows for {table.shape[0] - model._family.table_offset:,} positions).")
    out.notes.extend(model._family.notes(model.config))
    if model.method == "rope":
        out.inv_freq, out.attention_factor = model.frequencies(model.train_length)
        if len(model.layer_ropes) > 1:
            out.notes.append("Its layers turn with one θ per layer type ("
                             + ", ".join(f"{k}: θ = {float(v.get('rope_theta', 10000.0)):,.0f}" for k, v in model.layer_ropes.items())
                             + f"); drawn here: the {model._drawn_layer_type.replace('_', '-')} layers'.")
        if model.rotary_dims < model.head_dim:
            out.notes.append(f"Only {model.rotary_dims} of each head's {model.head_dim} dimensions rotate "
                             f"({model.rotary_dims / model.head_dim:.0%}); the rest carry no position.")
    elif model.method == "nope":
        out.notes.append("Its attention layers use no positions" + (
            f"; the order of the text comes from its {sum(m.carries_order for m in model.mixers)} "
            "recurrent or convolution layers, which read it token after token." if model.acts_on == "recurrence" else "."))
    elif model.method == "alibi":
        out.slopes, notes = alibi_slopes_as_added(model.config, model.n_head)
        out.notes.extend(notes + probes.eager_alibi_notes(model.config))
    return out

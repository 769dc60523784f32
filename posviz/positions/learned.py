"""Learned absolute position embeddings (GPT-2 style): one trained vector per position.

Radford et al. 2019 / Devlin et al. 2018. The table has exactly ``train_length`` rows, so the model
has no representation at all for a later position: asking for one is an error, not a guess.
Shapes: pos (T,), table (max_len, C).
"""
from __future__ import annotations

import dataclasses

from torch import nn

from posviz.config import require
from posviz.errors import PositionLimitError
from posviz.positions.base import PositionMethod, position_range


@dataclasses.dataclass
class LearnedOptions:
    max_len: int | None = None  # rows in the table; None means the model's train_length

    def __post_init__(self):
        require(self.max_len is None or (isinstance(self.max_len, int) and self.max_len >= 1),
                f"learned max_len must be a positive integer or None, got {self.max_len!r}")


class LearnedAbsolute(PositionMethod):
    name = "learned"
    display_name = "learned"
    summary = "A trained vector per position added to the input; nothing exists past the table."
    paper = "https://cdn.openai.com/better-language-models/language_models_are_unsupervised_multitask_learners.pdf"
    acts_on = "input"
    kind = "absolute"
    learned = True
    Options = LearnedOptions

    def __init__(self, shape, options=None):
        super().__init__(shape, options)
        self.max_len = self.options.max_len or shape.train_length
        self.table = nn.Embedding(self.max_len, shape.n_embd)
        nn.init.normal_(self.table.weight, std=0.02)

    @property
    def max_positions(self):
        return self.max_len

    def check_positions(self, pos):
        last = position_range(pos)[1] if pos.numel() else -1
        if last >= self.max_len:
            raise PositionLimitError(
                f"The learned absolute table has {self.max_len:,} rows (positions 0 to {self.max_len - 1:,}), "
                f"but position {last:,} was asked for. There is no position-{last:,} "
                "representation: the model only learned vectors for the positions it saw in training. "
                f"Use a length of at most {self.max_len:,}, or a sliding window of at most {self.max_len:,} bytes."
            )

    def add_to_input(self, x, pos):  # x (B, T, C), pos (T,)
        self.check_positions(pos)
        return x + self.table(pos).to(x.dtype)

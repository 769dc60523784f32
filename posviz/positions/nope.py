"""NoPE: no position information at all; only the causal mask orders the tokens.

Kazemnejad et al. 2023, "The Impact of Positional Encoding on Length Generalization in Transformers",
https://arxiv.org/abs/2305.19466 . A causal decoder can still infer position (e.g. by counting how
much attention mass is spread), which is why NoPE is a real baseline and not a strawman.
"""
from posviz.positions.base import PositionMethod


class NoPE(PositionMethod):
    name = "nope"
    summary = "No position signal; order comes only from the causal mask."
    paper = "https://arxiv.org/abs/2305.19466"
    acts_on = "nothing"
    kind = "none"

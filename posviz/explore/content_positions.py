"""The numbers behind the Positions from content page: one layer of a checkpoint whose method computes what
counts as far from the text (FoX, CoPE, stick-breaking, PaTH) on a visitor's text, read through the method's own
hooks (``token_state``, ``content_bias``, ``content_scorer``, ``attention_weights``), as attention calls them.

Pure functions, no plotting, no Streamlit. Shapes: T bytes shown, H heads; matrices are (H, T, T) with row i
the query and column j the key, NaN above the diagonal (future keys).
"""
from __future__ import annotations

import dataclasses
import math

import numpy as np
import torch

from posviz.models.byte_gpt import GPT
from posviz.positions import POSITION_METHODS, method_names
from posviz.positions.base import PositionMethod, Seen

MAX_BYTES = 256  # the page draws T x T matrices per head: one training length at most


def content_methods() -> list[str]:
    """The registered methods whose positions are computed from the text, in display order."""
    return [m for m in method_names() if POSITION_METHODS[m].kind == "content"]


@dataclasses.dataclass
class LayerView:
    """One layer of a model on one text: what its method computed, per head."""

    ids: np.ndarray  # (T,) the bytes shown
    scores: np.ndarray  # (H, T, T) q . k / sqrt(hs): what a plain softmax would read
    weights: np.ndarray  # (H, T, T) the attention the method gives
    softmax: np.ndarray  # (H, T, T) a plain softmax of the same scores, without the method's bias or normalisation
    bias: np.ndarray | None  # (H, T, T) what the method added to the scores (FoX's D, CoPE's q . e[p]); None
    state: np.ndarray | None  # (H, T) the per-byte values it computed from the layer's input (FoX: log f); None
    counts: np.ndarray | None  # (H, T, T) CoPE's counted positions p_ij; None for the others
    # (H, T) PaTH: the angle in degrees by which each key is turned from itself when the last byte's query reads it,
    # and the share of its length left (a Householder step with 0 < beta < 2, beta != 1, shortens); None for others
    turn_degrees: np.ndarray | None = None
    length_left: np.ndarray | None = None


def _future_nan(m: torch.Tensor) -> np.ndarray:
    T = m.shape[-1]
    out = m.double().cpu().numpy().copy()
    out[..., ~np.tril(np.ones((T, T), dtype=bool))] = np.nan
    return out


@torch.inference_mode()
def layer_view(net: GPT, ids, layer: int) -> LayerView:
    """``net`` on ``ids`` (at most ``MAX_BYTES``), and layer ``layer``'s attention taken apart."""
    ids = torch.as_tensor(ids, dtype=torch.long)[:MAX_BYTES].to(net.device)
    T = ids.numel()
    attn, position = net.blocks[layer].attn, net.position
    seen_input: dict = {}

    def keep_input(module, args):  # returns None: the layer runs on its arguments unchanged
        seen_input["x"] = args[0]

    hook = attn.register_forward_pre_hook(keep_input)
    try:
        net(ids[None])  # the layer's input is the model's own hidden state at that depth
    finally:
        hook.remove()
    x = seen_input["x"]  # (1, T, C)
    q, k, _ = attn.heads(x)  # (1, H, T, hs)
    hs = q.shape[-1]
    pos = torch.arange(T, device=ids.device)
    q, k = position.rotate_qk(q, k, pos)
    state = position.token_state(layer, x)  # (1, H, T), (1, H, T, m) or None
    causal = torch.ones(T, T, dtype=torch.bool, device=ids.device).tril()
    seen = Seen(causal, pos, state)
    scores = (q.float() @ k.float().transpose(-2, -1)) / math.sqrt(hs)  # (1, H, T, T)
    scorer = position.content_scorer(layer, q.float(), k.float(), None if state is None else state.float())
    bias = position.content_bias(layer, scores, q, k, seen)
    if scorer is not None:  # a transform between key and query (PaTH): what it changed is its "bias"
        bias = scorer(0, T, T) - scores
    biased = scores if bias is None else scores + bias
    weights = position.attention_weights(layer, biased, seen)
    softmax = PositionMethod.attention_weights(position, layer, scores, seen)  # the plain softmax, as any method's
    counts = position.counted_positions(scores, seen)  # CoPE's; None for the others
    turned = position.turned_keys(k.double(), None if state is None else state.double())  # PaTH's; None for the others
    turn = length = None
    if turned is not None:
        kk, tt = k.double()[0], turned[0]  # (H, T, hs)
        norms = kk.norm(dim=-1) * tt.norm(dim=-1)
        cos = ((kk * tt).sum(-1) / norms.clamp(min=1e-30)).clamp(-1.0, 1.0)
        turn = torch.rad2deg(torch.arccos(cos)).cpu().numpy()
        length = (tt.norm(dim=-1) / kk.norm(dim=-1).clamp(min=1e-30)).cpu().numpy()
    position.forget()
    return LayerView(ids.cpu().numpy(), _future_nan(scores[0]), _future_nan(weights[0]), _future_nan(softmax[0]),
                     None if bias is None else _future_nan(bias[0]),
                     None if state is None or state.dim() != 3 else state[0].double().cpu().numpy(),
                     None if counts is None else _future_nan(counts[0]), turn, length)


def forget_gates(view: LayerView, head: int) -> np.ndarray:
    """(T,) FoX's forget gate f_t of one head: how much of everything before byte t survives it."""
    return np.exp(view.state[head])


def counted_beside_distance(view: LayerView, head: int, query: int) -> dict[str, np.ndarray]:
    """For one query: every key's distance, CoPE's counted position, and the plain count (distance + 1)."""
    distance = np.arange(query, -1, -1)  # keys 0..query, farthest first
    return {"key": np.arange(query + 1), "distance": distance, "counted": view.counts[head, query, :query + 1],
            "plain": distance + 1.0}


def on_own_value(view: LayerView, head: int) -> np.ndarray:
    """(T,) the weight each query puts on its own byte's value (the diagonal of its attention). For stick-breaking
    that is the remainder: what no earlier key broke off, which the reference forward gives the query itself."""
    return np.diagonal(view.weights[head]).copy()


def gate_means(view: LayerView, ids_where: np.ndarray) -> dict[str, float]:
    """Mean forget gate (over heads) on the bytes where ``ids_where`` holds, and elsewhere."""
    gates = np.exp(view.state)  # (H, T)
    return {"there": float(gates[:, ids_where].mean()) if ids_where.any() else float("nan"),
            "elsewhere": float(gates[:, ~ids_where].mean()) if (~ids_where).any() else float("nan")}


BYTE_CLASSES = {"newline": b"\n", "space": b" ", "punctuation": b"()[]{}:,.=\"'#"}


def byte_class(ids: np.ndarray) -> np.ndarray:
    """(T,) the class of each byte: "newline", "space", "punctuation" or "other"."""
    out = np.full(len(ids), "other", dtype=object)
    for name, members in BYTE_CLASSES.items():
        out[np.isin(ids, list(members))] = name
    return out


def findings(net: GPT, documents, windows: int = 8) -> dict:
    """What the content methods learned, measured on ``windows`` windows of one training length from each of
    ``documents`` (held-out text), per layer: FoX's mean forget gate on each byte class; CoPE's counted
    position of the key one training length minus one back, as a share of the plain count; the mean weight a
    query puts on its own value (stick-breaking's remainder) and the mean distance of its attention against a
    softmax of the same scores."""
    L = min(MAX_BYTES, net.config.train_length)
    out: dict = {}
    for layer in range(net.config.n_layer):
        rows: dict[str, list] = {}
        for doc in documents:
            for w in range(windows):
                ids = np.frombuffer(doc[w * L:(w + 1) * L], dtype=np.uint8).astype(np.int64)
                if len(ids) < L:
                    break
                view = layer_view(net, ids, layer)
                if view.state is not None:
                    gates, classes = np.exp(view.state), byte_class(view.ids)
                    for name in ("newline", "space", "punctuation", "other"):
                        if (classes == name).any():
                            rows.setdefault(f"gate on {name}", []).append(float(gates[:, classes == name].mean()))
                if view.counts is not None:
                    rows.setdefault("counted / plain at the far key", []).append(
                        float(np.mean(view.counts[:, L - 1, 0] / L)))
                rows.setdefault("on its own value", []).append(
                    float(np.mean(np.diagonal(view.weights, axis1=-2, axis2=-1))))
                distance = np.arange(L)[:, None] - np.arange(L)[None, :]
                for name, weights in (("attention distance", view.weights), ("softmax distance", view.softmax)):
                    rows.setdefault(name, []).append(float(np.nanmean(np.nansum(weights * distance, -1))))
        out[layer] = {k: float(np.mean(v)) for k, v in rows.items()}
    return out


def main(argv=None) -> None:
    """``python -m posviz.explore.content_positions CHECKPOINT``: ``findings`` on the first four held-out files, as
    docs/results.md quotes them (one JSON object: per layer, each measure's mean)."""
    import argparse
    import json

    from posviz.models.checkpoint_files import load_checkpoint
    from posviz.training.data import load_corpus

    ap = argparse.ArgumentParser(description=main.__doc__.splitlines()[0])
    ap.add_argument("checkpoint", help="a checkpoint folder, e.g. models/stick_breaking")
    ap.add_argument("--documents", type=int, default=4, help="held-out files read (default 4)")
    ap.add_argument("--windows", type=int, default=4, help="windows of one training length per file (default 4)")
    args = ap.parse_args(argv)
    net = load_checkpoint(args.checkpoint)
    out = findings(net, load_corpus().eval_documents[:args.documents], args.windows)
    print(json.dumps({str(k): {m: round(v, 4) for m, v in row.items()} for k, row in out.items()}, indent=1))


if __name__ == "__main__":
    main()


def near_weight_sentence(weights, softmax, name: str, layer: int, head: int, near: int = 8) -> str:
    """What the attention map shows, in one sentence from it: the mean share of each query's weight on its ``near``
    nearest keys (itself included), under the method and under a plain softmax of the same scores."""
    def share(matrix) -> float:
        m = np.nan_to_num(np.asarray(matrix, dtype=float))
        i, j = np.indices(m.shape)
        return float((m * ((i - j >= 0) & (i - j < near))).sum(axis=1).mean())
    return (f"In layer {layer}, head {head} of {name}, a query puts on average {share(weights):.0%} of its weight on its "
            f"{near} nearest keys; a plain softmax of the same queries and keys would put {share(softmax):.0%} there.")

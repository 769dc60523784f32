"""The numbers behind the RoPE page's sections for the rotary methods of 2025 and the Canon layers beside them:
FoPE's Fourier series per pair (which of RoPE's frequencies it keeps, how each pair mixes them), PoPE's phases (its
frequencies and the learned key phase per feature), and what a Canon layer's kernel weighs per channel.

Pure functions over a built method (its weights loaded or as initialised), no plotting, no Streamlit.
"""
from __future__ import annotations

import math

import numpy as np
import torch

from posviz.positions.fope import kept_frequencies


def fope_frequencies(method) -> dict[str, np.ndarray]:
    """RoPE's hs/2 frequencies for FoPE's head size and base, each with its wavelength 2 pi / w (positions per turn)
    and whether FoPE keeps it (it turns at least once within the floor length) or zeroes it."""
    inv_freq, kept = kept_frequencies(method.shape.head_dim, method.options.base, method.options.floor_length)
    inv = inv_freq.numpy()
    return {"pair": np.arange(len(inv)), "frequency": inv, "wavelength": 2 * math.pi / inv,
            "kept": inv >= 2 * math.pi / method.options.floor_length}


def fope_series(method, head: int) -> dict[str, np.ndarray]:
    """Long table of head ``head``'s series: for every pair p with a series and every kept frequency D, the weight
    of cos(t w_D) in the pair's cos and of sin(t w_D) in its sin (as the rotation uses them: over their column sums
    when the method normalises). Pairs past the series turn at frequency 0 and are not listed. A method with a set per
    layer: layer 0's."""
    rows = {"pair": [], "frequency index": [], "frequency": [], "part": [], "weight": []}
    kept = method.kept_freq.numpy()
    for part, coef in zip(("cos", "sin"), method.coefficients(torch.float64)):
        c = coef[head].numpy()  # (D, pairs)
        for d in range(c.shape[0]):
            for p in range(c.shape[1]):
                rows["pair"].append(p)
                rows["frequency index"].append(d)
                rows["frequency"].append(float(kept[d]))
                rows["part"].append(part)
                rows["weight"].append(float(c[d, p]))
    return {k: np.asarray(v) for k, v in rows.items()}


def fope_leakage(method) -> float:
    """The mean share of a series pair's weight off its own frequency (0: plain RoPE on the kept pairs), over heads,
    pairs and both parts: how much each pair mixes in the others."""
    shares = []
    for coef in (method.cos_coef, method.sin_coef):
        c = coef.double()
        c = (c / c.sum(dim=1, keepdim=True)).abs()  # (H, D, pairs)
        own = torch.stack([c[:, p, p] for p in range(min(c.shape[1], c.shape[2]))], dim=-1)  # (H, pairs)
        shares.append((1 - own / c.sum(dim=1)[..., :own.shape[-1]]).mean().item())
    return float(np.mean(shares))


def pope_phases(method) -> dict[str, np.ndarray]:
    """Long table of PoPE's features per head: the frequency theta_c, its wavelength, and the key's learned phase
    delta_c in degrees (clamped to [-360, 0] as attention uses it)."""
    hs, H = method.shape.head_dim, method.shape.n_head
    theta = method.inv_freq.double().numpy()
    delta = np.degrees(method.key_phase().detach().double().cpu().numpy())  # (H, hs)
    return {"head": np.repeat(np.arange(H), hs), "feature": np.tile(np.arange(hs), H),
            "frequency": np.tile(theta, H), "wavelength": np.tile(2 * math.pi / theta, H),
            "key phase (degrees)": delta.reshape(-1)}


def pope_score_by_distance(method, distances: np.ndarray, magnitude: float = 1.0) -> dict[str, np.ndarray]:
    """PoPE's logit for a query and a key whose every feature has magnitude ``magnitude`` (softplus of the content),
    per head, at each distance: sum_c mu^2 cos(d theta_c - delta_c) / sqrt(hs). The position's part alone: with the
    content fixed, what is left is where the key sits."""
    theta = method.inv_freq.double().numpy()
    delta = method.key_phase().detach().double().cpu().numpy()  # (H, hs)
    d = np.asarray(distances, dtype=float)
    out = {"distance": np.tile(d, delta.shape[0]), "head": np.repeat(np.arange(delta.shape[0]), len(d))}
    score = np.cos(d[None, :, None] * theta[None, None, :] - delta[:, None, :]).sum(-1) * magnitude ** 2
    out["logit"] = (score / math.sqrt(len(theta))).reshape(-1)
    return out


def canon_kernel(method, layer: int, site: str) -> np.ndarray | None:
    """(D, K) what ``site`` of ``layer`` weighs: column 0 the byte K - 1 back, the last column the byte itself (the
    residual adds the byte once more); None where the site has no Canon layer."""
    w = method.kernel(layer, site)
    return None if w is None else w.detach().double().cpu().numpy()


def canon_reach(method) -> dict[str, np.ndarray]:
    """Long table per layer and site: the mean absolute weight on the byte itself and on each earlier byte: how
    far back each site reads."""
    rows = {"layer": [], "site": [], "bytes back": [], "mean |weight|": []}
    for layer in range(method.shape.n_layer):
        for site in method.options.sites:
            w = canon_kernel(method, layer, site)
            K = w.shape[1]
            for back in range(K):
                rows["layer"].append(layer)
                rows["site"].append(site)
                rows["bytes back"].append(back)
                rows["mean |weight|"].append(float(np.abs(w[:, K - 1 - back]).mean()))
    return {k: np.asarray(v) for k, v in rows.items()}


def temperature_curve(method, lengths) -> dict[str, np.ndarray]:
    """Long table of the query scale at each position of ``lengths`` (a NoPE method with a temperature), beside
    Llama 4's own (floor_scale 8,192 over its 256K-token context) at the same share of its context, so that the two
    curves' steps compare: position i of a text trained at L reads as i × 262,144 / L for Llama 4."""
    from posviz.positions.nope import query_temperature

    pos = torch.as_tensor(np.asarray(lengths, dtype=np.int64))
    ours = query_temperature(pos, method.options.temperature_floor_scale, method.options.temperature_attn_scale)
    llama = query_temperature(pos * (LLAMA4_CONTEXT // method.shape.train_length), 8192, 0.1)
    rows = {"position": np.concatenate([pos.numpy()] * 2),
            "query scale": np.concatenate([ours.double().numpy(), llama.double().numpy()]),
            "curve": np.repeat([f"this method (floor {method.options.temperature_floor_scale})",
                                "Llama 4 at the same share of its context"], len(pos))}
    return rows


LLAMA4_CONTEXT = 262_144  # tokens: Llama 4's pretraining context, over which its floor_scale of 8,192 takes 32 steps


def gates_and_sinks(net, ids: torch.Tensor) -> dict[str, np.ndarray]:
    """Per layer and head of a gated-attention model (``net``, a byte GPT) on ``ids`` (1, T): the mean of its output
    gate (sigmoid, 0 closed to 1 open) over positions and channels, and the weight its queries past the first put on
    the first byte (the attention sink StreamingLLM found), so the two read side by side: does a head that can close
    still park its weight on byte 0?"""
    rows = {"layer": [], "head": [], "mean gate": [], "weight on the first byte": []}
    inputs: dict[int, torch.Tensor] = {}
    hooks = [block.attn.register_forward_pre_hook(lambda module, args, layer=layer: inputs.__setitem__(layer, args[0]))
             for layer, block in enumerate(net.blocks)]
    try:
        with torch.no_grad():
            for layer in range(len(net.blocks)):
                probs = net(ids, attention_layer=layer).attention  # (1, H, T, T)
                gate = net.position.at_layer(layer).output_gate(layer, inputs[layer])  # (1, H, T, hs) or None
                for head in range(probs.shape[1]):
                    rows["layer"].append(layer)
                    rows["head"].append(head)
                    rows["mean gate"].append(float("nan") if gate is None else float(gate[0, head].double().mean()))
                    rows["weight on the first byte"].append(float(probs[0, head, 1:, 0].double().mean()))
    finally:
        for hook in hooks:
            hook.remove()
    return {k: np.asarray(v) for k, v in rows.items()}


def mla_logit_tables(net, ids: torch.Tensor) -> dict[int, dict[str, torch.Tensor]]:
    """Each attention layer's logits of an MLA model (``net``, a byte GPT with ``mla_rope``) on ``ids`` (1, T), split
    in their two parts (H, T, T): content, q_nope . k_nope / sqrt(d), and position, q_rope . R(i - j) k_rope / sqrt(d)
    (d the whole query width, the scale attention uses); their sum is the logit attention takes its softmax of."""
    method = net.position
    inputs: dict[int, torch.Tensor] = {}
    hooks = [block.attn.register_forward_pre_hook(lambda module, args, layer=layer: inputs.__setitem__(layer, args[0]))
             for layer, block in enumerate(net.blocks) if block.attn is not None]
    try:
        with torch.no_grad():
            net(ids)
    finally:
        for hook in hooks:
            hook.remove()
    pos = torch.arange(ids.shape[1], device=ids.device)
    tables = {}
    with torch.no_grad():
        for layer in sorted(inputs):
            q, k, _ = method.at_layer(layer).project_heads(layer, inputs[layer])  # (1, H, T, rot + nope)
            q, k = method.rotate_qk(q, k, pos)  # the rotated part first (``mla_rope``)
            r, scale = method.rot_dim, q.shape[-1] ** -0.5
            tables[layer] = {"position (rotated part)": (q[..., :r] @ k[..., :r].transpose(-1, -2) * scale)[0],
                             "content (unrotated part)": (q[..., r:] @ k[..., r:].transpose(-1, -2) * scale)[0]}
    return tables


def mla_logit_parts(net, ids: torch.Tensor, max_distance: int) -> dict[str, np.ndarray]:
    """``mla_logit_tables`` as rows (layer, distance, part, mean logit): each part averaged over the heads and over the
    queries at each distance i - j < max_distance."""
    rows = {"layer": [], "distance": [], "part": [], "mean logit": []}
    for layer, parts in mla_logit_tables(net, ids).items():
        for part, logits in parts.items():
            table = logits.double().mean(0)  # (T, T) over the heads
            for d in range(min(max_distance, table.shape[0])):
                rows["layer"].append(layer)
                rows["distance"].append(d)
                rows["part"].append(part)
                rows["mean logit"].append(float(table.diagonal(-d).mean()))
    return {k: np.asarray(v) for k, v in rows.items()}

"""The training-free RoPE remaps (posviz/positions/rope_remaps.py) against loop-by-loop readings of their
reference code's forward, plus their properties: the plain model inside the near window, each map's query
positions a function of i alone and key positions of j alone, cached decoding equal to the full pass, and
defaults that cover the length asked.

The readings (each pair (i, j <= i), in the reference's own terms):
* Self-Extend, datamllab/LongLM ``self_extend_patch/Llama.py``: ``neighbor_attention_mask`` keeps RoPE for
  i - j < group_size_2 (W); elsewhere ``group_query_position = i // G + W - W // G`` (the decoding step's
  integer form) against ``group_key_position = j // G``.
* ReRoPE, bojone/rerope ``rerope_patch.py``: ``rectified_mask = |i - j| < window`` keeps RoPE; elsewhere the
  query at ``window`` and the key unrotated; every query times ``max(1, log(i + 1) / log(training_length))``.
* Leaky ReRoPE, ``leaky_rerope_patch.py``: outside the mask the query at ``i + window * (k - 1)`` and the key at
  ``j``, both under linear scaling by k (positions divided by k); the same query scale.
* Dual chunk attention, HKUNLP/ChunkLlama ``chunkllama_attn_replace.py``: ``chunk_len = chunk_size -
  local_window``; keys at ``j % chunk_len``; a query in the key's chunk at ``i % chunk_len`` (``q_t``), in the
  next chunk at ``qc_t = min(i % chunk_len + chunk_len, chunk_size)``, further at ``qc_t[chunk_len - 1]``.
* STRING, HKUNLP/STRING ``string_for_llama.py`` (its decoding step): keys closer than ``diag_size`` (S) with
  RoPE; the others with the query at ``i - S + local_window``; cos and sin times ``0.1 ln 2 + 1``.
"""
from __future__ import annotations

import math

import pytest
import torch

from conftest import decode_in_chunks, tiny_model
from posviz.errors import ConfigError
from posviz.positions import ModelShape, build_position_method
from posviz.positions.rope_remaps import ROPE_REMAPS, relative_position_matrix

L = 32  # the tiny models' training length
SHAPE = ModelShape(n_layer=2, n_head=2, head_dim=8, n_embd=16, train_length=L)
CASES = [  # (remap, options): small windows, so that every map is used within a few dozen positions
    ("self_extend", {"group": 3, "window": 8}),
    ("self_extend", {"group": 4, "window": 8}),
    ("rerope", {"window": 8}),
    ("rerope", {"window": 5, "log_scale": False}),
    ("leaky_rerope", {"window": 8, "stretch": 3.0}),
    ("dca", {"chunk_size": 12, "local_window": 2}),
    ("string", {"shift": 10, "local_window": 3}),
]
IDS = [f"{name}-{'-'.join(f'{k}{v}' for k, v in o.items())}" for name, o in CASES]


def reference_positions(name: str, o: dict, i: int, j: int) -> tuple[float, float]:
    """(query position, key position) the reference code attends the pair (i, j) at."""
    if name == "self_extend":
        G, W = o["group"], o["window"]
        return (i, j) if i - j < W else (i // G + W - W // G, j // G)
    if name == "rerope":
        return (i, j) if abs(i - j) < o["window"] else (o["window"], 0)
    if name == "leaky_rerope":
        w, k = o["window"], o["stretch"]
        return (i, j) if abs(i - j) < w else ((i + w * (k - 1)) / k, j / k)
    if name == "dca":
        size, local = o["chunk_size"], o["local_window"]
        chunk_len = size - local
        q_t = [p for p in range(chunk_len)]
        qc_t = [min(p + chunk_len, size) for p in range(chunk_len)]
        key = j % chunk_len
        if i // chunk_len == j // chunk_len:
            return q_t[i % chunk_len], key
        if i // chunk_len == j // chunk_len + 1:
            return qc_t[i % chunk_len], key
        return qc_t[chunk_len - 1], key
    if name == "string":
        return (i, j) if i - j < o["shift"] else (i - o["shift"] + o["local_window"], j)
    raise AssertionError(name)


def reference_factor(name: str, o: dict) -> float:
    return 0.1 * math.log(2) + 1 if name == "string" else 1.0


def query_scale(name: str, o: dict, i: int) -> float:
    if name in ("rerope", "leaky_rerope") and o.get("log_scale", True):
        return max(1.0, math.log(i + 1) / math.log(L))
    return 1.0


def rotate(x: torch.Tensor, position: float, base: float = 10000.0) -> torch.Tensor:
    """RoPE by hand, NeoX halves: pair m = (x[m], x[m + d/2]) turned by position * base^(-2m/d)."""
    d = x.shape[-1]
    out = x.clone()
    for m in range(d // 2):
        angle = position * base ** (-2 * m / d)
        a, b = x[..., m], x[..., m + d // 2]
        out[..., m] = a * math.cos(angle) - b * math.sin(angle)
        out[..., m + d // 2] = a * math.sin(angle) + b * math.cos(angle)
    return out


def scores_of(method, q, k, T):
    pos = torch.arange(T)
    scorer = method.pair_scorer(0, q, k, pos, pos)
    scores = scorer(0, T, T, pos, pos)
    method.forget()
    return scores


@pytest.mark.parametrize("name,options", CASES, ids=IDS)
def test_each_pair_is_scored_as_the_reference_code_scores_it(name, options):
    torch.manual_seed(0)
    T = 40  # past L, so the query scale and every map show
    method = build_position_method("rope", SHAPE, {"remap": name, "remap_options": options})
    q, k = torch.randn(1, 2, T, 8, dtype=torch.float64), torch.randn(1, 2, T, 8, dtype=torch.float64)
    ours = scores_of(method, q, k, T)
    factor = reference_factor(name, options)
    for i in range(T):
        for j in range(i + 1):
            pq, pk = reference_positions(name, options, i, j)
            expected = (rotate(q[0, :, i] * query_scale(name, options, i), pq) * factor
                        * rotate(k[0, :, j], pk) * factor).sum(-1) / math.sqrt(8)
            torch.testing.assert_close(ours[0, :, i, j], expected, rtol=1e-9, atol=1e-9,
                                       msg=lambda m: f"{name} pair ({i}, {j}): {m}")


@pytest.mark.parametrize("name,options", CASES, ids=IDS)
def test_inside_the_near_window_a_remap_is_the_plain_model(name, options):
    torch.manual_seed(1)
    T = L  # within the training length ReRoPE's query scale is 1
    remapped = build_position_method("rope", SHAPE, {"remap": name, "remap_options": options})
    plain = build_position_method("rope", SHAPE)
    q, k = torch.randn(1, 2, T, 8, dtype=torch.float64), torch.randn(1, 2, T, 8, dtype=torch.float64)
    ours = scores_of(remapped, q, k, T)
    pos = torch.arange(T)
    qr, kr = plain.rotate_qk(q, k, pos)
    want = qr @ kr.transpose(-2, -1) / math.sqrt(8)
    near = {"self_extend": options.get("window"), "rerope": options.get("window"),
            "leaky_rerope": options.get("window"), "string": options.get("shift")}.get(name)
    d = pos[:, None] - pos[None, :]
    if name == "dca":  # the plain model inside a chunk
        chunk = options["chunk_size"] - options["local_window"]
        inside = (pos[:, None] // chunk == pos[None, :] // chunk) & (d >= 0)
        torch.testing.assert_close(ours[..., inside], want[..., inside])
    else:
        factor = reference_factor(name, options) ** 2
        inside = (d >= 0) & (d < near)
        torch.testing.assert_close(ours[..., inside], want[..., inside] * factor)
        assert not torch.allclose(ours[..., (d >= near)], want[..., (d >= near)] * factor), "the far pairs moved"


@pytest.mark.parametrize("name", list(ROPE_REMAPS))
def test_query_positions_read_i_alone_and_key_positions_j_alone(name):
    """The contract ``Rotary.pair_scorer`` relies on to rotate each side once per layer."""
    remap = ROPE_REMAPS[name]
    opts = remap.build(None, L, 4 * L)
    pos = torch.arange(4 * L)
    whole = remap.maps(pos, pos, opts, L)
    for j in (0, 7, 4 * L - 1):
        one = remap.maps(pos, pos[j:j + 1], opts, L)
        for a, b in zip(whole.q_positions, one.q_positions):
            assert torch.equal(a, b)
    for i in (0, 9, 4 * L - 1):
        one = remap.maps(pos[i:i + 1], pos, opts, L)
        for a, b in zip(whole.k_positions, one.k_positions):
            assert torch.equal(a, b)


@pytest.mark.parametrize("name,options", CASES, ids=IDS)
def test_cached_decoding_equals_the_full_pass(name, options):
    """Keys are cached unrotated and rotated per map when attended: every remap stays cacheable."""
    model = tiny_model("rope", seed=3, position_options={"remap": name, "remap_options": options})
    idx = torch.randint(0, 256, (1, 70), generator=torch.Generator().manual_seed(5))
    with torch.inference_mode():
        full = model(idx).logits
        cached = decode_in_chunks(model, idx, [20, 1, 1, 13, 1, 34])
    torch.testing.assert_close(cached, full, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("multiple", [1, 2, 4, 16])
def test_defaults_cover_the_length_asked(multiple):
    """Self-Extend, Leaky ReRoPE and DCA keep every relative position inside the training length at any length;
    ReRoPE clips at w; STRING covers up to 2L - W and says nothing beyond."""
    T = multiple * L
    for name in ROPE_REMAPS:
        rel = relative_position_matrix(name, None, L, T)
        top = float(rel[~rel.isnan()].max())
        if name == "string" and T > 2 * L - L // 16:
            assert top > L - 1  # cannot cover: S itself passes L
            continue
        assert top <= L - 1 + 1e-9, f"{name} at {multiple}x sees relative position {top} past L - 1 = {L - 1}"
    se = ROPE_REMAPS["self_extend"].build(None, L, T)
    smaller = se.group - 1  # the smallest group that covers: one less does not
    assert se.window == L // 4 and (smaller == 0 or (T - 1) // smaller + se.window - se.window // smaller > L - 1)


def test_a_remap_pins_every_value_and_rejects_what_it_does_not_know():
    method = build_position_method("rope", SHAPE, {"remap": "self_extend", "factor": 4.0})
    pinned = method.pinned_options()
    assert pinned["remap_options"] == {"group": 6, "window": 8}  # 127 // 6 + 8 - 8 // 6 = 28 <= 31; G = 5 gives 32
    again = build_position_method("rope", SHAPE, pinned)
    assert again.remap_options == method.remap_options
    with pytest.raises(ConfigError, match="Known remaps: self_extend, rerope, leaky_rerope, dca, string"):
        build_position_method("rope", SHAPE, {"remap": "self_extnd"})
    with pytest.raises(ConfigError, match="groop"):
        build_position_method("rope", SHAPE, {"remap": "self_extend", "remap_options": {"groop": 2}})
    with pytest.raises(ConfigError, match="dynamic"):
        build_position_method("rope", SHAPE, {"remap": "dca", "scaling": "dynamic", "factor": 2.0})
    with pytest.raises(ConfigError, match="positive integer"):
        build_position_method("rope", SHAPE, {"remap": "rerope", "remap_options": {"window": 0}})


def test_p_rope_takes_the_remaps_too():
    model = tiny_model("p_rope", seed=2, position_options={"remap": "self_extend", "remap_options": {"group": 2, "window": 8}})
    plain = tiny_model("p_rope", seed=2)
    idx = torch.randint(0, 256, (1, 8), generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():  # within the window: the plain model
        torch.testing.assert_close(model(idx).logits, plain(idx).logits, rtol=1e-5, atol=1e-5)


def test_evaluate_runs_a_remap_covering_each_length(tiny_models_dir, capsys):
    """``python -m posviz.evaluate --scaling self_extend``: each length with the defaults that cover it (never the
    plain model past 1x), ``--option`` sets a parameter, and a method without RoPE is refused with words."""
    from posviz.labs.scoring import bits_per_byte
    from posviz.models.checkpoint_files import load_checkpoint
    from posviz.training.data import as_id_tensor, load_corpus
    from posviz.training.evaluate import main

    folder = tiny_models_dir / "rope"
    main(["--checkpoint", str(folder), "--scaling", "self_extend", "--multiples", "1", "4", "--eval-bytes", "4096",
          "--copy-gaps"])
    out = capsys.readouterr().out
    assert "remap self_extend covering each length" in out and "group=6, window=8" in out, out
    data = as_id_tensor(load_corpus().eval_stream(4096))
    four = bits_per_byte(load_checkpoint(folder, {"remap": "self_extend", "factor": 4.0}), data, 128, progress=False)
    assert f"     128    4.0 {four:>10.4f}" in out, out

    main(["--checkpoint", str(folder), "--scaling", "rerope", "--option", "window=3", "--option", "log_scale=false",
          "--multiples", "2", "--eval-bytes", "4096", "--copy-gaps"])
    assert "window=3, log_scale=False" in capsys.readouterr().out
    with pytest.raises(SystemExit, match="the remaps apply to the RoPE checkpoints"):
        main(["--checkpoint", str(tiny_models_dir / "alibi"), "--scaling", "dca", "--multiples", "1", "--copy-gaps"])
    with pytest.raises(SystemExit, match="KEY=VALUE"):
        main(["--checkpoint", str(folder), "--scaling", "dca", "--option", "chunk_size"])


@pytest.mark.parametrize("layout", ["local_global", "irope", "rope_sinks"])
def test_a_layout_hands_the_remap_to_its_rotary_layers(layout):
    """Each rotary layer of a layout takes the remap (its pinned options keep it, so the checkpoint reloads as it
    ran); the other layers are as they were, and cached decoding still equals the full pass."""
    options = {"remap": "rerope", "remap_options": {"window": 6}, "factor": 4.0}
    model = tiny_model(layout, seed=4, position_options=options)
    plain = tiny_model(layout, seed=4)
    rotary = [i for i, m in enumerate(plain.position.layer_methods) if m.takes_remaps]
    assert rotary, layout
    for i, m in enumerate(model.position.layer_methods):
        assert (m.pinned_options().get("remap") == "rerope") == (i in rotary)
    pinned = model.position.pinned_options()
    assert "remap" not in pinned and tiny_model(layout, seed=4, position_options=pinned).position.layer_methods[
        rotary[0]].remap_options.window == 6
    idx = torch.randint(0, 256, (1, 40), generator=torch.Generator().manual_seed(2))
    with torch.inference_mode():
        full = model(idx).logits
        torch.testing.assert_close(decode_in_chunks(model, idx, [17, 1, 22]), full, rtol=1e-4, atol=1e-4)
        near = idx[:, :6]  # within w: the plain layout
        torch.testing.assert_close(model(near).logits, plain(near).logits, rtol=1e-5, atol=1e-5)

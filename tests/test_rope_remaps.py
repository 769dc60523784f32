"""The training-free RoPE remaps (posviz/positions/rope_remaps.py) against loop-by-loop readings of their
reference code's forward, plus their properties: the plain model inside the near window, each map's query
positions a function of i alone and key positions of j alone, cached decoding equal to the full pass, and
defaults that cover the length asked.

The readings (each pair (i, j <= i), in the reference's own terms):
* Self-Extend, datamllab/LongLM ``self_extend_patch/Llama.py``: ``neighbor_attention_mask`` keeps RoPE for
  i - j < group_size_2 (W); elsewhere ``group_query_position = i // G + W - W // G`` (the integer form of its
  flash decoding step and of Mistral.py, Qwen2.py and Phi.py; Llama.py's prefill writes W - W / G) against
  ``group_key_position = j // G``.
* ReRoPE, bojone/rerope ``rerope_patch.py``: ``rectified_mask = |i - j| < window`` keeps RoPE; elsewhere the
  query at ``window`` and the key unrotated; every query times ``max(1, log(i + 1) / log(training_length))``.
* Leaky ReRoPE, ``leaky_rerope_patch.py``: outside the mask the query at ``i + window * (k - 1)`` and the key at
  ``j``, both under linear scaling by k (positions divided by k); the same query scale.
* Dual chunk attention, HKUNLP/ChunkLlama ``chunkllama_attn_replace.py``: ``chunk_len = chunk_size -
  local_window``; keys at ``j % chunk_len``; a query in the key's chunk at ``i % chunk_len`` (``q_t``), in the
  next chunk at ``qc_t = min(i % chunk_len + chunk_len, chunk_size)``, further at ``qc_t[chunk_len - 1]``.
  Its cos and sin tables (q, qc and k alike) are multiplied by ``get_mscale`` of the length (``ReferenceMscale``).
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
    """The factor on cos and sin at the length the options cover (L: CASES run at factor 1)."""
    if name == "string":
        return 0.1 * math.log(2) + 1
    if name == "dca":
        return ReferenceMscale(o.get("scale", "chunkllama_attn_replace"), L).forward(L)
    return 1.0


class ReferenceMscale:
    """HKUNLP/ChunkLlama's ``ChunkLlamaRotaryEmbedding``, its scale alone, as each file writes it.

    ``get_mscale(scale)``: 1.0 if scale <= 1, else ``0.05 * math.log(scale) + 1.0`` in chunkllama_attn_replace.py,
    ``0.1 * ...`` in flash_decoding_chunkllama.py; chunkqwen_attn_replace.py has none and multiplies nothing.
    ``__init__``: ``max_seq_len = max_position_embeddings`` and the tables built at it. ``_set_cos_sin_cache(seq_len)``:
    ``scale = seq_len / max_position_embeddings``; q, qc and k cos and sin each times ``get_mscale(scale)``.
    ``forward(x, seq_len)``: the tables rebuilt at seq_len when it is past ``max_seq_len``, which becomes seq_len.
    The attention's forward calls it with ``seq_len=kv_seq_len``: a prefill of T tokens reads the factor at T."""
    COEFFICIENT = {"chunkllama_attn_replace": 0.05, "flash_decoding_chunkllama": 0.1, "chunkqwen_attn_replace": None}

    def __init__(self, file: str, max_position_embeddings: int):
        self.coefficient = self.COEFFICIENT[file]
        self.max_position_embeddings = self.max_seq_len = max_position_embeddings
        self.mscale = self._set_cos_sin_cache(self.max_seq_len)

    def get_mscale(self, scale: float) -> float:
        if self.coefficient is None:
            return 1.0
        if scale <= 1:
            return 1.0
        return self.coefficient * math.log(scale) + 1.0

    def _set_cos_sin_cache(self, seq_len: int) -> float:
        return self.get_mscale(seq_len / self.max_position_embeddings)

    def forward(self, seq_len: int) -> float:
        if seq_len > self.max_seq_len:
            self.mscale = self._set_cos_sin_cache(seq_len)
            self.max_seq_len = seq_len
        return self.mscale


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


@pytest.mark.parametrize("file", list(ReferenceMscale.COEFFICIENT))
def test_dca_attention_factor_is_the_reference_scale_at_the_length_covered(file):
    """1 while the text fits the training length, then each file's get_mscale at T / L; the default is
    chunkllama_attn_replace.py's, and a pinned factor is kept whatever the length."""
    dca = ROPE_REMAPS["dca"]
    for T in (L // 2, L, L + 1, 2 * L, 4 * L, 16 * L, 100 * L + 3):
        expected = ReferenceMscale(file, L).forward(T)
        got = dca.build({"scale": file}, L, T).attention_factor
        assert got == pytest.approx(expected, rel=1e-12, abs=0), (file, T)
        if T <= L or file == "chunkqwen_attn_replace":
            assert got == 1.0
        else:
            assert got > 1.0
    assert dca.build(None, L, 16 * L).attention_factor == ReferenceMscale("chunkllama_attn_replace", L).forward(16 * L)
    assert dca.build({"attention_factor": 1.25, "scale": file}, L, 16 * L).attention_factor == 1.25


@pytest.mark.parametrize("file", list(ReferenceMscale.COEFFICIENT))
def test_dca_past_the_context_scores_each_pair_as_the_reference_with_its_scale_squared(file):
    """Resolved for 4L, every pair's score is the reference's: q and k each rotated and times the factor, so the
    logit times its square; and exactly the unscaled remap's logit times that square."""
    torch.manual_seed(4)
    T, options = 40, {"chunk_size": 12, "local_window": 2}
    m = ReferenceMscale(file, L).forward(4 * L)
    method = build_position_method("rope", SHAPE, {"remap": "dca", "factor": 4.0, "remap_options": {**options, "scale": file}})
    unscaled = build_position_method("rope", SHAPE, {"remap": "dca", "factor": 4.0,
                                                     "remap_options": {**options, "scale": "chunkqwen_attn_replace"}})
    q, k = torch.randn(1, 2, T, 8, dtype=torch.float64), torch.randn(1, 2, T, 8, dtype=torch.float64)
    ours = scores_of(method, q, k, T)
    for i in range(T):
        for j in range(i + 1):
            pq, pk = reference_positions("dca", options, i, j)
            expected = (rotate(q[0, :, i], pq) * m * rotate(k[0, :, j], pk) * m).sum(-1) / math.sqrt(8)
            torch.testing.assert_close(ours[0, :, i, j], expected, rtol=1e-9, atol=1e-9)
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    torch.testing.assert_close(ours[..., causal], scores_of(unscaled, q, k, T)[..., causal] * m ** 2, rtol=1e-12, atol=1e-12)


def test_dca_with_its_scale_decodes_as_the_full_pass_and_pins_its_factor():
    """The factor is resolved once for the length covered (not the length so far, as the reference reads it), so
    a KV cache decodes exactly; it is pinned, and a bad scale is refused with the names it takes."""
    model = tiny_model("rope", seed=3, position_options={"remap": "dca", "factor": 4.0})
    factor = ReferenceMscale("chunkllama_attn_replace", L).forward(4 * L)
    assert model.position.remap_options.attention_factor == pytest.approx(factor, rel=1e-12)
    idx = torch.randint(0, 256, (1, 70), generator=torch.Generator().manual_seed(5))
    with torch.inference_mode():
        full = model(idx).logits
        torch.testing.assert_close(decode_in_chunks(model, idx, [20, 1, 1, 13, 1, 34]), full, rtol=1e-4, atol=1e-4)
    pinned = build_position_method("rope", SHAPE, {"remap": "dca", "factor": 4.0}).pinned_options()
    assert pinned["remap_options"] == {"chunk_size": 24, "local_window": 2, "scale": "chunkllama_attn_replace",
                                       "attention_factor": pytest.approx(factor, rel=1e-12)}
    again = build_position_method("rope", SHAPE, {**pinned, "factor": 16.0})  # a pinned factor stays as it ran
    assert again.remap_options.attention_factor == pinned["remap_options"]["attention_factor"]
    with pytest.raises(ConfigError, match="chunkllama_attn_replace, flash_decoding_chunkllama, chunkqwen_attn_replace"):
        build_position_method("rope", SHAPE, {"remap": "dca", "remap_options": {"scale": "chunkllama"}})
    with pytest.raises(ConfigError, match="positive number"):
        build_position_method("rope", SHAPE, {"remap": "dca", "remap_options": {"attention_factor": -1.0}})


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
    with pytest.raises(SystemExit, match="alibi cannot take the dca remap: it uses alibi positions"):
        main(["--checkpoint", str(tiny_models_dir / "alibi"), "--scaling", "dca", "--multiples", "1", "--copy-gaps"])
    with pytest.raises(SystemExit, match="KEY=VALUE"):
        main(["--checkpoint", str(folder), "--scaling", "dca", "--option", "chunk_size"])


def test_evaluate_applies_a_methods_own_option_without_a_scaling(tiny_models_dir, capsys):
    """``--option`` with no ``--scaling`` is the method's own option at inference (NoPE's query temperature on the nope
    checkpoint): it was read and dropped, printing the plain model's numbers as the option's."""
    from posviz.labs.scoring import bits_per_byte
    from posviz.models.checkpoint_files import load_checkpoint
    from posviz.training.data import as_id_tensor, load_corpus
    from posviz.training.evaluate import main

    folder = tiny_models_dir / "nope"
    main(["--checkpoint", str(folder), "--option", "temperature_floor_scale=1", "--option", "temperature_attn_scale=20", "--multiples", "4", "--eval-bytes", "4096",
          "--copy-gaps"])
    out = capsys.readouterr().out
    data = as_id_tensor(load_corpus().eval_stream(4096))
    hot = bits_per_byte(load_checkpoint(folder, {"temperature_floor_scale": 1, "temperature_attn_scale": 20}), data, 128, progress=False)
    plain = bits_per_byte(load_checkpoint(folder), data, 128, progress=False)
    assert abs(hot - plain) > 1e-4 and f"     128    4.0 {hot:>10.4f}" in out, (hot, plain, out)
    with pytest.raises(SystemExit, match="temperature_floor_scal"):  # a key the method does not have: refused in words
        main(["--checkpoint", str(folder), "--option", "temperature_floor_scal=2", "--multiples", "1", "--copy-gaps"])


def test_evaluate_all_reruns_one_remap_and_keeps_every_other_stored_result(tiny_models_dir, tmp_path, monkeypatch):
    """``python -m posviz.evaluate_all --remaps-only --remap dca`` (and ``--effective-only --remap dca``): that remap's
    block written as ``remap_block`` (``effective_length_block``) gives it, every other stored block as it was."""
    import shutil

    from posviz.models.checkpoint_files import read_metrics, write_metrics
    from posviz.training import evaluate_all
    from posviz.training.data import load_corpus
    from posviz.training.evaluate import remap_block

    folder = tmp_path / "rope"
    shutil.copytree(tiny_models_dir / "rope", folder)
    metrics = read_metrics(folder)
    metrics["eval"]["rope_remaps"] = {r: {"stored": r} for r in ROPE_REMAPS}
    metrics["eval"]["effective_length"] = {"as_trained": {"stored": 0}, "dca": {"stored": 1}, "rerope": {"stored": 2}}
    write_metrics(folder, metrics)
    monkeypatch.setattr(evaluate_all, "shipped_checkpoints", lambda: {"rope": folder, "alibi": tiny_models_dir / "alibi"})
    evaluate_all.main(["--remaps-only", "--remap", "dca", "--eval-bytes", "4096", "--device", "cpu"])
    ev = read_metrics(folder)["eval"]
    assert list(ev["rope_remaps"]) == list(ROPE_REMAPS)
    assert all(ev["rope_remaps"][r] == {"stored": r} for r in ROPE_REMAPS if r != "dca")
    lengths = [int(n) for n in ev["nonoverlapping_bpb"] if int(n) <= 16 * L]
    data = load_corpus().eval_stream(4096)
    assert ev["rope_remaps"]["dca"] == remap_block(folder, "dca", data, lengths, L, progress=False)
    assert ev["rope_remaps"]["dca"]["options"][str(16 * L)]["attention_factor"] == pytest.approx(
        ReferenceMscale("chunkllama_attn_replace", L).forward(16 * L), rel=1e-12)
    assert "rope_remaps" not in read_metrics(tiny_models_dir / "alibi")["eval"]  # no RoPE: nothing written

    evaluate_all.main(["--effective-only", "--remap", "dca", "--device", "cpu"])
    effective = read_metrics(folder)["eval"]["effective_length"]
    assert effective["as_trained"] == {"stored": 0} and effective["rerope"] == {"stored": 2}
    assert {"multiple", "reason", "rows"} <= set(effective["dca"]) and effective["dca"]["rows"]
    assert "dca" not in read_metrics(tiny_models_dir / "alibi")["eval"].get("effective_length", {})
    with pytest.raises(SystemExit):
        evaluate_all.main(["--remap", "dca"])  # alone it names no block to re-run


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

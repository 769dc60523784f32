"""Unit tests of posviz.labs.extrapolation (the Extrapolation lab's scores) on tiny random models."""
from __future__ import annotations

import numpy as np
import pytest
from conftest import tiny_lab, tiny_model
from maths_support import full_forward_bits, sharp, text_ids  # noqa: F401  (text_ids: a fixture)

from posviz.models.shipped import as_lab_model
from posviz.models.interface import open_model
from posviz.labs import attention_maps, extrapolation, inputs as lab_inputs
from posviz.errors import PosvizError, PositionLimitError
from posviz.training.evaluate import bits_per_byte, sliding_window_bpb
from posviz.limits import max_eval_length
from posviz.positions import POSITION_METHODS, method_names


def test_length_options_span_a_few_bytes_to_the_cap():
    opts = extrapolation.length_options(256, 4096)
    assert opts[0] == 4 and opts[-1] == 4096 and 256 in opts and opts == sorted(set(opts))
    assert extrapolation.length_options(256, 100)[-1] == 100


# ------------------------------------------------------------------------------------------------
# Scoring at a length
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("method", method_names())
def test_score_at_length_matches_evaluate(method, text_ids):
    model = tiny_lab(method)
    length = 32  # the tiny models' training length: every method can run it
    score = extrapolation.score_at_length(model, text_ids, length)
    budget = max_eval_length(32)
    assert score.n_windows == budget // length and score.n_ids == score.n_windows * length + 1
    assert score.bpb == pytest.approx(bits_per_byte(model, text_ids[: score.n_ids], length), abs=1e-5)
    assert score.position_bits.shape == (length,) and np.isfinite(score.position_bits).all()
    assert np.isnan(score.id_bits[0]) and np.isfinite(score.id_bits[1:]).all()
    assert score.bpb == pytest.approx(np.nanmean(score.id_bits), abs=1e-6)
    # one window's byte losses are the full forward pass's
    first = full_forward_bits(model, text_ids[:length])
    assert np.allclose(score.id_bits[1:length], first, atol=1e-5)


@pytest.mark.parametrize("method", ["alibi", "learned"])
def test_stride_scoring_counts_each_byte_once_from_its_window(method, text_ids):
    """YaRN's sliding-window evaluation: windows of L advance by S and count their last S predictions;
    S = L is the non-overlapping score, and any S is evaluate's sliding_window_bpb over the same bytes."""
    model = tiny_lab(method)
    plain, same = extrapolation.score_at_length(model, text_ids, 32), extrapolation.score_with_stride(model, text_ids, 32, 32)
    assert same.bpb == pytest.approx(plain.bpb, abs=1e-6) and same.n_windows == plain.n_windows
    assert np.allclose(same.id_bits, plain.id_bits, atol=1e-5, equal_nan=True)
    strided = extrapolation.score_with_stride(model, text_ids, 32, 8)
    assert strided.n_windows == (max_eval_length(32) - 32) // 8 + 1 and strided.n_ids == max_eval_length(32) + 1
    assert np.isnan(strided.id_bits[0]) and np.isfinite(strided.id_bits[1:]).all()
    assert strided.bpb == pytest.approx(sliding_window_bpb(model, text_ids[: strided.n_ids], 32, 8), abs=1e-5)
    # byte 41 is predicted by the window starting at byte 16 (it counts positions 24..31), from 25 bytes of context
    assert strided.id_bits[41] == pytest.approx(full_forward_bits(model, text_ids[16:49])[24], abs=1e-5)
    with pytest.raises(PosvizError, match="stride"):
        extrapolation.score_with_stride(model, text_ids, 32, 0)


def test_score_at_length_limits(text_ids):
    learned = tiny_lab("learned")
    with pytest.raises(PositionLimitError, match="32 rows"):
        extrapolation.score_at_length(learned, text_ids, 64)
    rope = tiny_lab("rope")
    cap = rope.length_cap
    assert cap == max_eval_length(32)
    with pytest.raises(PosvizError, match="cap"):
        extrapolation.score_at_length(rope, text_ids, cap * 2)
    with pytest.raises(PosvizError, match="needs 65 bytes of text"):
        extrapolation.score_at_length(rope, text_ids[:40], 64)
    with pytest.raises(PosvizError, match="at least 2"):
        extrapolation.score_at_length(rope, text_ids, 1)


@pytest.mark.parametrize("method", [m for m, cls in POSITION_METHODS.items() if m != "learned"])
def test_one_pass_inspection_equals_score_and_map_run_apart(method, text_ids):
    """At the cap (one window) the map's forward pass gives the score too; below it the two run apart."""
    model = as_lab_model(sharp(tiny_model(method)))
    for length in (model.length_cap, 64):
        score, view = extrapolation.inspect_at_length(model, text_ids, length, layer=1)
        apart_score = extrapolation.score_at_length(model, text_ids, length)
        apart_view = attention_maps.attention_view(model, text_ids, length, layer=1)
        assert (score.n_windows, score.n_ids) == (apart_score.n_windows, apart_score.n_ids)
        assert score.n_windows == (1 if length == model.length_cap else model.length_cap // 64)
        assert score.bpb == pytest.approx(apart_score.bpb, rel=1e-5)
        np.testing.assert_allclose(score.id_bits, apart_score.id_bits, rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(view.entropy, apart_view.entropy, rtol=1e-5)
        np.testing.assert_allclose(np.stack(view.maps), np.stack(apart_view.maps), rtol=1e-4, atol=1e-6)


def test_warming_the_default_view_stores_what_the_page_asks_for(tiny_models_dir, corpus):
    """The warm-up runs the page's own jobs (same keys) at every slider stop, visitors' work first;
    its stored results equal a direct computation, and learned past its table is left out."""
    import dataclasses

    from posviz.serving import SharedResults, WorkQueue

    folders = [str(tiny_models_dir / name) for name in ("nope", "learned", "rope")]
    text = lab_inputs.prepare_text(corpus.eval_documents[0]).as_bytes()
    results, queue = SharedResults(), WorkQueue()
    done = extrapolation.warm_default_view(results, queue, folders, text)
    model = open_model(folders[0])
    train_length, layer = model.train_length, model.n_layer - 1
    stops = extrapolation.length_options(train_length, min(model.length_cap, len(text)))
    reachable = sum(1 for n in stops for f in folders if not (f.endswith("learned") and n > train_length))
    assert done == reachable
    assert queue.served == len(stops) * len(folders)  # learned's refusals took their turn too
    for length in (stops[0], train_length, stops[-1]):
        for i, folder in enumerate(folders):
            job = extrapolation.scoring_job(open_model(folder), text, length, i == 0, layer, True)
            found, value = results.get((job.name, job.key))
            if folder.endswith("learned") and length > train_length:
                assert not found
                continue
            assert found, (folder, length)
            score = value[0] if job.name == "extrapolation-inspect" else value
            direct = dataclasses.asdict(extrapolation.score_at_length(open_model(folder), list(text), length))
            assert score["bpb"] == pytest.approx(direct["bpb"], abs=1e-5)
    top = extrapolation.scoring_job(open_model(folders[0]), text, stops[-1], True, layer, True)
    assert top.name == "extrapolation-inspect"  # at the cap the inspected model's map comes with its score


def test_warming_stops_when_told(tiny_models_dir, corpus):
    import threading

    from posviz.serving import SharedResults, WorkQueue

    stop = threading.Event()
    stop.set()
    text = lab_inputs.prepare_text(corpus.eval_documents[0]).as_bytes()
    results = SharedResults()
    assert extrapolation.warm_default_view(results, WorkQueue(), [str(tiny_models_dir / "nope")], text, stop=stop) == 0
    assert len(results) == 0


@pytest.mark.parametrize("name", ["rope", "alibi"])
def test_a_shipped_score_comes_with_its_interval_over_the_windows(name):
    """Each shipped checkpoint stores its windows' bits per byte: their mean is the stored score, and the lab's
    interval (a bootstrap over them) brackets it, wider at 16x (31 windows) than at 1x (511)."""
    from posviz.models.checkpoint_files import shipped_checkpoints

    model = open_model(shipped_checkpoints()[name])
    block = model.stored_metrics()["eval"]
    found = extrapolation.shipped_bpb_intervals(model)
    assert set(found) >= {256, 1024, 4096}
    widths = {}
    for n in (256, 1024, 4096):
        windows = block["nonoverlapping_window_bpb"][str(n)]
        assert len(windows) == (block["eval_bytes"] - 1) // n
        assert np.mean(windows) == pytest.approx(block["nonoverlapping_bpb"][str(n)], abs=2e-4)
        low, high = (float(v) for v in found[n].split(" ")[0].split("–"))
        assert low < block["nonoverlapping_bpb"][str(n)] < high and f"{len(windows)} windows" in found[n]
        widths[n] = high - low
    assert widths[256] < widths[4096]


def test_a_request_checks_its_length_once_where_it_enters_the_lab(monkeypatch):
    """Each job the Extrapolation lab runs checks the length it was asked for once (``LabModel.check_length``)
    and hands it on checked: the score, the map and the scorer under them take it as it is. A length they
    compute themselves (the Compare lab's L beside 2L) is checked where it is made."""
    from posviz.labs import compare, context_extension
    from posviz.models.interface import CheckedLength, LabModel

    calls = []
    real = LabModel.check_length
    monkeypatch.setattr(LabModel, "check_length", lambda self, *a, **k: calls.append(a[0]) or real(self, *a, **k))
    model = tiny_lab("alibi")
    text = bytes(range(32, 127)) * 6  # 570 bytes: 17 windows of 32, one of 128
    jobs = {"score": extrapolation.score_job(model, text, 32), "inspect, one window": extrapolation.inspect_job(
                model, text, 512, 1, True),
            "inspect, several": extrapolation.inspect_job(model, text, 32, 1, True),
            "stride": extrapolation.stride_job(model, text, 32, 8), "attention": extrapolation.attention_job(model, text, 32, 1, True)}
    for what, job in jobs.items():
        calls.clear()
        job.compute()
        assert len(calls) == 1, (what, calls)
    calls.clear()
    context_extension.length_scores(model, model.tokenize(text).ids, [32, 64, 128])
    assert sorted(calls) == [32, 64, 128]  # each length of the request once
    calls.clear()
    compare.compare_lengths(model, model.tokenize(text).ids, 32)
    assert sorted(calls) == [32, 64]
    # what is handed on: an int everywhere, checked; arithmetic on it gives a plain int, checked again if asked
    checked = real(model, 32, len(text))
    assert isinstance(checked, CheckedLength) and checked == 32 and type(2 * checked) is int
    with pytest.raises(PosvizError, match="at least 2"):
        model.checked(1, len(text))
    assert model.checked(checked, 3) is checked  # a checked length is not checked again

"""Planted repeats (posviz.training.data.plant_repeats): the recipe's way to make copying from context pay.

The probes and the lab measure whether a model copies; these tests check the data that teaches it:
the copied span is really the row's own earlier text, targets stay the inputs shifted by one, the
draws are the same for every method, and a recipe without repeats keeps the old data order exactly.
"""
from __future__ import annotations

import numpy as np
import torch

from posviz.training.data import batch_offsets, get_batch, plant_repeats

TEXT = np.frombuffer(bytes(range(256)) * 64, dtype=np.uint8)  # no span repeats by itself within 256 bytes


def batch(seed: int = 0, rows: int = 64, length: int = 64):
    gen = torch.Generator().manual_seed(seed)
    x, y = get_batch(TEXT, batch_offsets(TEXT.size, rows, length, gen), length)
    return x, y, gen


def longest_repeat(row: torch.Tensor) -> tuple[int, int, int]:
    """(length, first start, second start) of the longest span that occurs twice without overlap."""
    values, best = row.tolist(), (0, -1, -1)
    for shift in range(1, len(values)):
        run = 0
        for i in range(len(values) - shift):
            run = run + 1 if values[i] == values[i + shift] else 0
            if run > best[0] and run <= shift:
                best = (run, i - run + 1, i - run + 1 + shift)
    return best


def test_every_chosen_row_holds_a_copy_of_its_own_earlier_text_and_targets_stay_shifted():
    x, y, gen = batch()
    original = torch.cat((x, y[:, -1:]), 1)
    px, py = plant_repeats(x, y, probability=1.0, min_bytes=8, max_bytes=24, generator=gen)
    assert px.shape == x.shape and torch.equal(px[:, 1:], py[:, :-1])  # y is still x moved by one
    planted = torch.cat((px, py[:, -1:]), 1)
    for b in range(x.shape[0]):
        length, first, second = longest_repeat(planted[b])
        assert 8 <= length <= 24 + 2, (b, length)  # a neighbour byte may match by chance: at most one each side
        changed = (planted[b] != original[b]).nonzero().flatten()
        assert changed.numel() and changed.min() >= second - 1 and changed.max() <= second + length
        # the source is the untouched original text
        assert torch.equal(planted[b, first:first + length], original[b, first:first + length])
    assert not torch.equal(x, px)


def test_probability_sets_the_share_of_rows_and_zero_changes_nothing_not_even_the_draws():
    x, y, gen = batch(rows=400)
    px, _ = plant_repeats(x, y, probability=0.25, min_bytes=8, max_bytes=24, generator=gen)
    share = (px != x).any(1).float().mean().item()
    assert 0.17 < share < 0.33

    x, y, gen = batch(seed=3)
    before = gen.get_state()
    px, py = plant_repeats(x, y, probability=0.0, min_bytes=8, max_bytes=24, generator=gen)
    assert px is x and py is y and torch.equal(gen.get_state(), before)  # the v1 recipe's data order


def test_same_seed_same_rows_whatever_the_method():
    """The draws come from the data generator only, so every method sees the very same rows."""
    a = plant_repeats(*batch(seed=7)[:2], probability=0.5, min_bytes=8, max_bytes=24, generator=batch(seed=7)[2])
    b = plant_repeats(*batch(seed=7)[:2], probability=0.5, min_bytes=8, max_bytes=24, generator=batch(seed=7)[2])
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])


def test_a_span_longer_than_half_the_row_is_cut_to_fit():
    x, y, gen = batch(length=20)
    px, py = plant_repeats(x, y, probability=1.0, min_bytes=4, max_bytes=100, generator=gen)
    assert px.shape == (64, 20) and torch.equal(px[:, 1:], py[:, :-1])
    for b in range(8):
        assert longest_repeat(torch.cat((px[b], py[b, -1:])))[0] >= 4

"""Unit tests of posviz.labs.inputs (what every live lab reads: the text and the cached models)."""
from __future__ import annotations

import math

import numpy as np
import pytest

from posviz.labs import inputs as lab_inputs
from posviz.errors import PosvizError
from posviz.limits import MAX_TEXT_BYTES


# ------------------------------------------------------------------------------------------------
# Text
# ------------------------------------------------------------------------------------------------
def test_prepare_text_rejects_empty_and_caps_huge_text():
    for empty in ("", "   \n\t ", b""):
        with pytest.raises(PosvizError, match="empty"):
            lab_inputs.prepare_text(empty)
    huge = lab_inputs.prepare_text("x" * (MAX_TEXT_BYTES + 10))
    assert len(huge) == MAX_TEXT_BYTES
    assert any(f"{MAX_TEXT_BYTES:,}" in n for n in huge.notices)
    plain = lab_inputs.prepare_text("def f():\n\treturn 1\n")
    assert plain.notices == () and plain.as_bytes() == b"def f():\n\treturn 1\n"
    odd = lab_inputs.prepare_text(b"ab\x00\x01c\xff")
    assert any("2 non-text" in n for n in odd.notices) and any("UTF-8" in n for n in odd.notices)


def test_characters_with_bits_groups_utf8_and_sums_bytes():
    data = "aé€".encode()  # 1 + 2 + 3 bytes
    bits = np.array([np.nan, 1.0, 2.0, 3.0, 4.0, 5.0])
    chars = lab_inputs.characters_with_bits(list(data), bits)
    assert [c for c, _ in chars] == ["a", "é", "€"]
    assert math.isnan(chars[0][1]) and chars[1][1] == 3.0 and chars[2][1] == 12.0
    broken = lab_inputs.characters_with_bits([0xFF, 0x41], np.array([1.0, 2.0]))
    assert broken == [("\ufffd", 1.0), ("A", 2.0)]


def test_moving_average_skips_nan():
    out = lab_inputs.moving_average(np.array([np.nan, 1.0, 3.0, np.nan, 5.0]), 3)
    assert out[0] == 1.0 and out[1] == 2.0 and out[2] == 2.0 and out[3] == 4.0 and out[4] == 5.0
    assert np.array_equal(lab_inputs.moving_average(np.array([1.0, 2.0]), 1), [1.0, 2.0])


@pytest.mark.parametrize("threads, label", [(1, "CPU (1 thread)"), (2, "CPU (2 threads)")])
def test_the_cpu_label_counts_threads_in_words(threads, label, monkeypatch):
    import torch

    from posviz import limits

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch, "get_num_threads", lambda: threads)
    assert limits.device_label() == label

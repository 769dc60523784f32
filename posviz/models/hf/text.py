"""Text as a published model reads it: the tokenizer's ids, and exactly how many bytes each id covers.
"""
from __future__ import annotations

import json

import numpy as np
import torch


def _byte_level_alphabet() -> dict[str, int]:
    """GPT-2's byte-level alphabet, character -> byte: printable bytes stand for themselves, the other
    68 are moved to code points from 256 up (the scheme of byte-level BPE, Radford et al. 2019)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars, extra = {}, 0
    for b in range(256):
        if b in printable:
            chars[chr(b)] = b
        else:
            chars[chr(256 + extra)] = b
            extra += 1
    return chars


class TokenizerText:
    """encode / decode / bytes per id of a transformers tokenizer, exact for byte-level BPE tokenizers."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        backend = json.loads(tokenizer.backend_tokenizer.to_str()) if hasattr(tokenizer, "backend_tokenizer") else {}
        decoder = (backend.get("decoder") or {}).get("type")
        vocab = tokenizer.convert_ids_to_tokens(list(range(len(tokenizer))))
        special = set(tokenizer.all_special_ids)
        if decoder == "ByteLevel":  # every token is a string over the byte alphabet: its bytes exactly
            alphabet = _byte_level_alphabet()
            self.pieces = [b"" if i in special or tok is None else bytes(alphabet.get(ch, 63) for ch in tok)
                           for i, tok in enumerate(vocab)]
            self.exact = True
        else:  # other tokenizers: what each id decodes to on its own (a split character may be off)
            self.pieces = [b"" if i in special else tokenizer.decode([i]).encode("utf-8") for i in range(len(vocab))]
            self.exact = False
        self.sizes = np.array([len(p) for p in self.pieces], dtype=np.int64)

    def encode(self, text: bytes) -> torch.Tensor:
        string = text.decode("utf-8", errors="replace")
        ids = self.tokenizer(string, add_special_tokens=False)["input_ids"]
        return torch.tensor(ids, dtype=torch.long)

    def decode(self, ids) -> bytes:
        ids = torch.as_tensor(ids).flatten().tolist()
        if self.exact:
            return b"".join(self.pieces[i] for i in ids)
        return self.tokenizer.decode(ids).encode("utf-8")

    def bytes_per_id(self, ids) -> np.ndarray:
        return self.sizes[torch.as_tensor(ids).flatten().cpu().numpy()]

    def round_trips(self, text: bytes) -> bool:
        return self.decode(self.encode(text)) == text

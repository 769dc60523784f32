"""A short causal depthwise convolution over time, with the rows before a chunk kept in a KV cache: what Canon layers
are made of, and what PaTH runs over its Householder directions (fla's ``ShortConvolution``).

    y[t, d] = sum_{w = 0 .. K-1} weight[d, w] x[t - K + 1 + w, d]          (x before the text's first byte: 0)

Cached decoding feeds one byte at a time: the convolution then needs the K - 1 rows before it, which the cache keeps
under (layer, name) in ``KVCache.recent``. Without a cache a pass starts from zeros, as the reference's does.
Shapes: x (B, T, D); weight (D, K); history (B, K - 1, D).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F


def causal_conv(x: torch.Tensor, weight: torch.Tensor, cache=None, key: tuple | None = None) -> torch.Tensor:
    """y (B, T, D) of x (B, T, D) under a depthwise ``weight`` (D, K); the rows before x come from ``cache.recent[key]``
    (zeros without one), and the last K - 1 rows this pass read are kept there for the next."""
    B, T, D = x.shape
    K = weight.shape[-1]
    before = None if cache is None else cache.recent.get(key)
    if before is None or before.shape[0] != B:
        before = x.new_zeros(B, K - 1, D)
    xx = torch.cat((before.to(x.dtype), x), dim=1)  # (B, K - 1 + T, D)
    if cache is not None:
        cache.recent[key] = xx[:, xx.shape[1] - (K - 1):].detach()
    # conv1d is a cross-correlation: output t reads inputs t .. t + K - 1 of the padded row, i.e. x[t - K + 1 .. t]
    return F.conv1d(xx.transpose(1, 2), weight.to(x.dtype).unsqueeze(1), groups=D).transpose(1, 2)

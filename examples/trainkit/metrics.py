"""Accuracy counts and the parameter checksum."""

from __future__ import annotations

import hashlib

import torch
from torch import nn


def topk_correct(
    output: torch.Tensor, target: torch.Tensor, ks: tuple[int, ...] = (1, 5)
) -> list[int]:
    """How many rows have the target among the top-k logits, for each k (k capped at classes)."""
    maxk = min(max(ks), output.shape[1])
    pred = output.topk(maxk, dim=1).indices
    hits = pred.eq(target.view(-1, 1))
    return [int(hits[:, : min(k, maxk)].any(dim=1).sum()) for k in ks]


def param_checksum(model: nn.Module) -> str:
    """sha256 (first 16 hex digits) over the parameters' exact bytes, in name order.

    Ranks that hold bitwise-identical weights print the same value; buffers (BatchNorm
    running statistics, which each rank updates from its own shard) are left out.
    """
    h = hashlib.sha256()
    for name, p in sorted(model.named_parameters()):
        h.update(name.encode())
        h.update(p.detach().to("cpu", torch.float32).contiguous().numpy().tobytes())
    return h.hexdigest()[:16]

"""Accuracy counts and the parameter checksum."""

from __future__ import annotations

import hashlib

import torch
from torch import nn


def topk_correct(
    output: torch.Tensor, target: torch.Tensor, ks: tuple[int, ...] = (1, 5)
) -> list[int]:
    """How many rows have the target among the top-k logits, for each k (k capped at classes)."""
    return [int(hits) for hits in topk_hits(output, target, ks)]


def topk_hits(
    output: torch.Tensor, target: torch.Tensor, ks: tuple[int, ...] = (1, 5)
) -> list[torch.Tensor]:
    """topk_correct's counts as tensors on the output's device: counting them costs the
    training step no wait for the GPU."""
    maxk = min(max(ks), output.shape[1])
    pred = output.topk(maxk, dim=1).indices
    hits = pred.eq(target.view(-1, 1))
    return [hits[:, : min(k, maxk)].any(dim=1).sum() for k in ks]


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

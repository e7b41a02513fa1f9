"""A model on which two fusion rules nearly fire (the fusion report's test case, also a SPEC for
`dayzero compile --report`): a tanh GELU whose cubic coefficient is 0.05 instead of 0.044715,
and attention whose softmax runs over the queries instead of the keys."""

from __future__ import annotations

import math

import torch


class NearMisses(torch.nn.Module):
    def forward(self, q, k, v, x):
        g = 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.05 * torch.pow(x, 3))))
        scores = torch.matmul(q, k.transpose(-1, -2)) * 0.25
        probs = torch.softmax(scores, dim=-2)
        return torch.matmul(probs, v), g


def build():
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 2, 6, 16) for _ in range(3))
    return NearMisses(), (q, k, v, torch.randn(3, 8))

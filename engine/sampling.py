"""The target's choice of the next token: its argmax, or at temperature > 0 a sample made reproducible.

Sampling uses the Gumbel-max trick: argmax(logits / T + g) with g_v = -log(-log u_v) and u_v uniform
is an exact sample from softmax(logits / T). Here u_v is not drawn from a random stream but hashed
from (request seed, absolute position of the token being chosen, vocabulary id). So the noise a
request sees at position p is the same whether p is reached by an autoregressive step, by any node
of any DDTree verify, alone or in any batch. DDTree's accept walk follows these choices exactly as
it follows the greedy argmax, so with the same seed it emits exactly the autoregressive tokens:
lossless in the strongest sense, and sampling needs no rejection step.

The hash is integer arithmetic kept below 2**63 (no overflow), so the noise's bits are the same on
every device; only the final float64 log may differ in its last bit between CPU and GPU libraries.
"""

from __future__ import annotations

import math

import torch

MAX_SEED = 2**32  # seeds are 32-bit: the hash mixes 32-bit words
_MASK32 = 0xFFFFFFFF
# The lowest temperature that samples: below it logits / T can overflow float64 to inf, and the
# argmax of several infs is the first of them, not the likeliest token (0 is greedy).
MIN_TEMPERATURE = 1e-6


def valid_temperature(value: float) -> bool:
    """0 (greedy) or a finite temperature >= MIN_TEMPERATURE."""
    return value == 0 or MIN_TEMPERATURE <= value < math.inf


def choose_tokens(logits: torch.Tensor, positions: torch.Tensor, seeds: torch.Tensor, temperature: float
                  ) -> torch.Tensor:
    """The target's token at each place: logits [..., V]; positions [...] are the absolute positions
    of the tokens being chosen and seeds [...] the requests' seeds (both int64, broadcast to
    logits.shape[:-1]). Temperature 0 is plain greedy argmax; returns int64 [...]."""
    if temperature == 0:
        return logits.argmax(-1)
    vocab = torch.arange(logits.shape[-1], dtype=torch.int64, device=logits.device)
    uniform = _uniform(seeds[..., None], positions[..., None], vocab)
    gumbel = -torch.log(-torch.log(uniform))
    return (logits.double() / temperature + gumbel).argmax(-1)


def _uniform(seeds: torch.Tensor, positions: torch.Tensor, vocab: torch.Tensor) -> torch.Tensor:
    """A float64 in (0, 1) per (seed, position, vocab id), from three chained 32-bit hash rounds."""
    h = _mix32(seeds ^ 0x9E3779B9)
    h = _mix32(h ^ (positions & _MASK32))
    h = _mix32(h ^ vocab)
    return (h.double() + 0.5) / 2**32


def _mix32(x: torch.Tensor) -> torch.Tensor:
    """MurmurHash3's 32-bit finaliser (a bijection with full avalanche) on int64 tensors holding 32-bit words."""
    x = x & _MASK32
    x = x ^ (x >> 16)
    x = _mul32(x, 0x85EBCA6B)
    x = x ^ (x >> 13)
    x = _mul32(x, 0xC2B2AE35)
    return x ^ (x >> 16)


def _mul32(x: torch.Tensor, constant: int) -> torch.Tensor:
    """x * constant mod 2**32 in 16-bit halves, so no int64 product ever overflows."""
    low = x * (constant & 0xFFFF)
    high = ((x * (constant >> 16)) & 0xFFFF) << 16
    return (low + high) & _MASK32

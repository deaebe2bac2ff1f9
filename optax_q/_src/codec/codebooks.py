# Copyright 2026 The optax_q Authors.
#
# Licensed under the Apache License, Version 2.0 (the "License");
# you may not use this file except in compliance with the License.
# You may obtain a copy of the License at
#
#     http://www.apache.org/licenses/LICENSE-2.0
#
# Unless required by applicable law or agreed to in writing, software
# distributed under the License is distributed on an "AS IS" BASIS,
# WITHOUT WARRANTIES OR CONDITIONS OF ANY KIND, either express or implied.
# See the License for the specific language governing permissions and
# limitations under the License.
"""Tables of the low-bit codecs: 3- and 4-bit grids for optimizer moments.

Each function returns the sorted values of one grid, normalised so that its
largest magnitude is what a block's absolute maximum maps to; ``formats.py``
turns them into codebook `Format`s. A grid with
``2**bits`` codes may repeat a value (a symmetric signed grid repeats zero).

* Second moments span many decades inside one block (a log-normal ``v``
  with a spread of two in the log covers ``10**4`` and more), which a 4-bit
  linear grid cannot hold. The grids here keep the range: powers of two
  with ``M`` mantissa bits (``ue{E}m{M}``, unsigned, no zero), and linear
  grids companded by ``sqrt`` (storing ``sqrt(v)``, as FlashOptim does),
  mu-law or softsign.
* First moments are roughly normal within a block: the normal-quantile
  grid of QLoRA (``nf4``; ``nf3`` its 3-bit analogue), or a signed
  companded grid.

References:
  Dettmers et al, [QLoRA: Efficient Finetuning of Quantized
  LLMs](https://arxiv.org/abs/2305.14314), 2023 (NF4)

  Li et al, [Memory Efficient Optimizers with 4-bit
  States](https://arxiv.org/abs/2309.01507), 2023 (second moments without zero)

  FlashOptim ([arXiv 2602.23349](https://arxiv.org/abs/2602.23349)),
  2026 (``sqrt(v)`` storage, companding)
"""

from __future__ import annotations

import math
import statistics

import numpy as np

# The mu of mu-law companding by code width: the range of the unsigned grid
# (largest over smallest value) is then about 2**(bits + 4.5) at 4 bits.
MU = {3: 255.0, 4: 4095.0}
COMPANDERS = ('sqrt', 'mulaw', 'softsign')


def _f32(values) -> tuple[float, ...]:
  return tuple(float(v) for v in np.sort(np.asarray(values, np.float32)))


def normal_float(bits: int) -> tuple[float, ...]:
  """The normal-quantile grid NF``bits`` in [-1, 1] (``2**bits`` values).

  QLoRA's construction: ``2**(bits-1)`` positive values at the normal
  quantiles of ``linspace(offset, 1/2)`` (the last dropped),
  ``2**(bits-1) - 1`` negative ones likewise, and an exact zero, each side
  divided by its largest magnitude. ``offset`` is the mean of
  ``1 - 1/(2(n-1))`` and ``1 - 1/(2n)`` for ``n = 2**bits`` codes (0.9677
  for NF4, as QLoRA).
  """
  inv = statistics.NormalDist().inv_cdf
  n = 2**bits
  offset = 1 - (1 / (2 * (n - 1)) + 1 / (2 * n)) / 2
  half = n // 2
  pos = np.array([inv(p) for p in np.linspace(offset, 0.5, half + 1)[:-1]])
  neg = np.array([inv(p) for p in np.linspace(offset, 0.5, half)[:-1]])
  return _f32(np.concatenate([-neg / neg.max(), [0.0], pos / pos.max()]))


def unsigned_float(ebits: int, mbits: int) -> tuple[float, ...]:
  """``ue{E}m{M}``: ``2**(E+M)`` positive values, no zero, largest < 2.

  Every exponent field is normal: ``(1 + m / 2**M) * 2**(e - (2**E - 1))``
  for ``e < 2**E``, ``m < 2**M``, so the grid spans ``2**(2**E - 1)``
  binades down from its top (``ue4m0``: the 16 powers of two from
  ``2**-15`` to 1).
  """
  top = 2**ebits - 1
  return _f32([(1 + m / 2**mbits) * 2.0 ** (e - top)
               for e in range(2**ebits) for m in range(2**mbits)])


def _expand(kind: str, p: np.ndarray, bits: int) -> np.ndarray:
  """The inverse compander: grid positions ``p`` in [0, 1] to values."""
  if kind == 'sqrt':
    return p * p
  if kind == 'mulaw':
    mu = MU[bits]
    return np.expm1(p * math.log1p(mu)) / mu
  if kind == 'softsign':  # f(x) = 2x / (1 + x) on [0, 1].
    return p / (2.0 - p)
  raise ValueError(f'Unknown compander {kind!r}; allowed: {COMPANDERS}.')


def companded(kind: str, bits: int, *, signed: bool) -> tuple[float, ...]:
  """A linear grid of ``bits`` mapped through an inverse compander.

  Signed: ``2**bits - 1`` levels symmetric about an exact zero (zero
  repeated to fill the codes), the largest 1. Unsigned: ``2**bits`` levels
  without zero, at positions ``(k + 1) / 2**bits``, as Li et al.'s linear
  grid without zero.
  """
  n = 2**bits
  if signed:
    k = n // 2 - 1
    mag = _expand(kind, np.arange(k + 1) / k, bits)
    return _f32(np.concatenate([-mag[1:], [0.0, 0.0], mag[1:]]))
  return _f32(_expand(kind, (np.arange(n) + 1) / n, bits))

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
"""Fake quantizers of model weights and activations (PTQ and QAT).

A `Quantizer` rounds the last axis of an array (a weight matrix's
input dimension, an activation's features) to a symmetric uniform grid of
``2**bits`` levels and returns the values on the grid, in the input's dtype.
Two methods:

* ``'rtn'``: round to nearest with the absolute maximum as scale (per row:
  per token of an activation, per output row of a weight; or per tensor).
* ``'quest'``: QuEST (Panferov et al., 2025): a block-diagonal Hadamard
  rotation of the last axis (applied by the caller to *both* operands of a
  product, `optax_q.quant._src.linear_quant`), then the scale
  ``c_b * rms(row)`` that minimises the mean squared error of a Gaussian
  (`gaussian_clip`), values beyond it clipped.

The gradient is a straight-through estimator (``jax.custom_vjp``):
``'ste'`` passes it unchanged, ``'trust'`` only where the value was not
clipped (QuEST's trust mask). The rounding is the codec's
(`optax_q._src.codec.rounding.round_int`), computed in explicit float32
arithmetic that ``jit`` cannot elide.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
import numpy as np

from optax_q._src.codec import rounding as rounding_lib
from optax_q._src.core import validation

METHODS = ('rtn', 'quest')
GRIDS = ('midrise', 'midtread')
GRANULARITIES = ('row', 'tensor')
GRANULARITY_ALIASES = {'token': 'row', 'channel': 'row'}
GRADIENTS = ('ste', 'trust')
MIN_BITS, MAX_BITS = 2, 16
MAX_HADAMARD = 2**14
_BIG = 2.0**64
_F32_MAX = float(np.finfo(np.float32).max)
# QuEST's table of c_b for the mid-rise grid (Panferov et al., 2025).
QUEST_CLIP = {2: 1.4935, 4: 2.5139, 8: 3.8849}


def prescale(absmax: jax.Array) -> jax.Array:
  """An exact power of two bringing ``absmax`` into ``[2**-64, 2**64]``
  (1 where it is already there), so that values divided by a maximum or a
  step neither overflow nor go subnormal."""
  return jnp.where(absmax > _BIG, 1 / _BIG,
                   jnp.where(absmax < 1 / _BIG, _BIG, 1.0))


def levels(bits: int, grid: str) -> float:
  """The largest code magnitude: ``(2**bits - 1) / 2`` (mid-rise, codes at
  half-integers) or ``2**(bits - 1) - 1`` (mid-tread, integers and zero)."""
  return (2**bits - 1) / 2 if grid == 'midrise' else 2 ** (bits - 1) - 1


def _gaussian_mse(step: float, bits: int, grid: str) -> float:
  """Mean squared error of a standard normal on the uniform grid of
  ``step`` (clipped at the outer levels)."""
  top = levels(bits, grid)
  codes = (np.arange(2**bits) - top if grid == 'midrise'
           else np.arange(-top, top + 1))
  values = codes * step
  edges = np.concatenate([[-np.inf], (values[1:] + values[:-1]) / 2, [np.inf]])
  lo, hi = edges[:-1], edges[1:]
  # E[(x - v)^2; lo < x < hi] from the normal's partial moments.
  from scipy import special  # pylint: disable=g-import-not-at-top
  cdf = special.ndtr(hi) - special.ndtr(lo)
  finite = lambda t: np.where(np.isinf(t), 0.0, t)
  pdf = lambda t: np.exp(-0.5 * t * t) / math.sqrt(2 * math.pi)
  tpdf = lambda t: finite(t) * pdf(t)
  m1 = pdf(lo) - pdf(hi)
  m2 = cdf + tpdf(lo) - tpdf(hi)
  return float(np.sum(m2 - 2 * values * m1 + values**2 * cdf))


def gaussian_clip(bits: int, grid: str = 'midrise') -> float:
  """QuEST's ``c_b``: the outer level, in standard deviations, of the
  uniform grid of ``2**bits`` levels with the least mean squared error on a
  Gaussian.

  Computed (golden-section search on the closed-form error). For the
  mid-rise grid it gives QuEST's ``c_2 = 1.4935`` and ``c_4 = 2.5139`` to
  2e-4 (tested); at 8 bits it gives 3.9222 where QuEST's table has 3.8849
  (the error is flat there: 8.769e-5 against 8.782e-5, checked by
  quadrature). [`quest`][optax_q.quant.quest] uses QuEST's table (`QUEST_CLIP`)
  where it has the width and grid, and this function elsewhere.

  Args:
    bits: Bits of the grid, 2 to 16.
    grid: ``'midrise'`` or ``'midtread'``.

  Returns:
    ``c_b``, a float.

  Examples:
    >>> from optax_q import quant
    >>> round(quant.gaussian_clip(4), 3)
    2.514

  References:
    Panferov et al, [QuEST: Stable Training of LLMs with 1-Bit Weights and
    Activations](https://arxiv.org/abs/2502.05003), 2025
  """
  return _gaussian_clip(_check_bits(bits),
                       validation.check_choice(grid, 'grid', GRIDS))


@functools.cache
def _gaussian_clip(bits: int, grid: str) -> float:
  top = levels(bits, grid)
  lo, hi = 1e-3 / top, 12.0 / top
  ratio = (math.sqrt(5) - 1) / 2
  for _ in range(200):
    a, b = hi - ratio * (hi - lo), lo + ratio * (hi - lo)
    if _gaussian_mse(a, bits, grid) < _gaussian_mse(b, bits, grid):
      hi = b
    else:
      lo = a
  return top * (lo + hi) / 2


def clip_of(bits: int, grid: str) -> float:
  """QuEST's ``c_b`` where its table has it, else `gaussian_clip`."""
  if grid == 'midrise' and bits in QUEST_CLIP:
    return QUEST_CLIP[bits]
  return gaussian_clip(bits, grid)


def _check_bits(bits) -> int:
  return validation.check_int(bits, 'bits', low=MIN_BITS, high=MAX_BITS)


def check_hadamard_block(block, name: str = 'hadamard_block') -> int | None:
  """None, or a power of two in ``[1, 2**14]``."""
  if block is None:
    return None
  block = validation.check_int(block, name, low=1, high=MAX_HADAMARD)
  if block & (block - 1):
    raise ValueError(
        f'{name} must be a power of two (a Sylvester Hadamard matrix), got '
        f'{block}.')
  return block


@functools.cache
def _hadamard_np(n: int) -> np.ndarray:
  h = np.ones((1, 1), np.float64)
  while h.shape[0] < n:
    h = np.block([[h, h], [h, -h]])
  return (h / math.sqrt(n)).astype(np.float32)


def hadamard(n: int) -> jax.Array:
  """The ``n x n`` Sylvester Hadamard matrix divided by ``sqrt(n)``:
  symmetric and orthonormal (``H H^T = I``).

  Args:
    n: A power of two, up to ``2**14``.

  Returns:
    A float32 array of shape ``(n, n)``.

  Examples:
    >>> from optax_q import quant
    >>> import jax.numpy as jnp
    >>> h = quant.hadamard(4)
    >>> bool(jnp.allclose(h @ h.T, jnp.eye(4)))
    True
  """
  return jnp.asarray(_hadamard_np(check_hadamard_block(n, 'n')))


def rotate(x: jax.Array, block: int) -> jax.Array:
  """``x`` times the block-diagonal Hadamard matrix along its last axis.

  A last axis that ``block`` does not divide is zero-padded to a multiple
  of it (the result is wider): padding both operands of a product with
  zeros leaves the product unchanged, so ``rotate(x) @ rotate(w).T`` is
  ``x @ w.T`` for any width.
  """
  width = x.shape[-1]
  pad = -width % block
  if pad:
    x = jnp.pad(x, [(0, 0)] * (x.ndim - 1) + [(0, pad)])
  blocks = x.reshape(x.shape[:-1] + (-1, block))
  h = jnp.asarray(_hadamard_np(block), x.dtype)
  return jnp.einsum('...gk,kj->...gj', blocks, h).reshape(x.shape)


@dataclasses.dataclass(frozen=True)
class Quantizer:
  """A symmetric uniform fake quantizer of an array's last axis.

  Make one with [`rtn`][optax_q.quant.rtn] or [`quest`][optax_q.quant.quest];
  calling it returns the values on the grid (same shape and dtype). Hashable and
  static.

  Attributes:
    bits: Bits per value, 2 to 16 (``2**bits`` levels mid-rise,
      ``2**bits - 1`` mid-tread).
    method: ``'rtn'`` (absolute-maximum scale) or ``'quest'`` (``c_b``
      times the root mean square, values beyond it clipped).
    granularity: ``'row'`` (one scale per row of the last axis: per token,
      per output row of a weight) or ``'tensor'``.
    grid: ``'midrise'`` (levels at odd multiples of half a step, no zero;
      the paper's) or ``'midtread'`` (a zero level).
    gradient: ``'ste'`` (straight through) or ``'trust'`` (only where the
      value was not clipped).
    hadamard_block: Block of the Hadamard rotation applied to both
      operands of a linear layer before quantizing (None: no rotation;
      ``'quest'`` only).
  """

  bits: int = 4
  method: str = 'rtn'
  granularity: str = 'row'
  grid: str = 'midrise'
  gradient: str = 'ste'
  hadamard_block: int | None = None

  def __post_init__(self):
    _check_bits(self.bits)
    validation.check_choice(self.method, 'method', METHODS)
    validation.check_choice(self.granularity, 'granularity', GRANULARITIES)
    validation.check_choice(self.grid, 'grid', GRIDS)
    validation.check_choice(self.gradient, 'gradient', GRADIENTS)
    check_hadamard_block(self.hadamard_block)
    if self.method == 'rtn' and self.hadamard_block is not None:
      raise ValueError(
          f'hadamard_block={self.hadamard_block} is the rotation of '
          "method='quest'; method='rtn' takes hadamard_block=None (use "
          'quest(bits, hadamard_block=...) for a rotated quantizer).')

  def forward(self, x: jax.Array) -> tuple[jax.Array, jax.Array | None]:
    """The quantized values (float32) and, for ``'trust'``, the mask of
    values that were not clipped."""
    xf = jnp.asarray(x, jnp.float32)
    axes = (tuple(range(xf.ndim)) if self.granularity == 'tensor'
            else (xf.ndim - 1,))
    top = levels(self.bits, self.grid)
    absmax = jnp.max(jnp.abs(xf), axis=axes, keepdims=True)
    # Rows far from 1 are scaled by an exact power of two first, so that
    # neither their RMS nor their step overflows or goes subnormal.
    pre = prescale(absmax)
    xs, reach = xf * pre, absmax * pre
    if self.method == 'quest':
      unit = xs / jnp.where(reach > 0, reach, 1.0)
      reach = clip_of(self.bits, self.grid) * reach * jnp.sqrt(
          jnp.mean(unit * unit, axis=axes, keepdims=True))
    # Mid-rise: 2 reach / (2**bits - 1); mid-tread: reach / (2**(b-1) - 1).
    step = reach / top
    y = xs / jnp.where(step > 0, step, 1.0)
    if self.grid == 'midrise':
      # Odd-symmetric: ties (integer |y|) away from zero, zero to +step/2.
      mag = jnp.floor(jnp.abs(y)) + 0.5
      codes = jnp.where(y < 0, -1.0, 1.0) * jnp.minimum(mag, top)
    else:
      codes = jnp.clip(rounding_lib.round_int(y, None), -top, top)
    out = rounding_lib.saturate(codes * step / pre, _F32_MAX,
                                infinities=True)
    # A zero row stays zero; a row with a NaN or an infinity is NaN.
    out = jnp.where(step > 0, out, jnp.where(absmax == 0, 0.0, jnp.nan))
    out = jnp.where(jnp.isfinite(absmax), out, jnp.nan)
    mask = None
    if self.gradient == 'trust':
      # Not clipped: strictly within half a step of the outer level.
      mask = (jnp.abs(y) < top + 0.5).astype(jnp.float32)
    return out, mask

  def __call__(self, x: jax.Array) -> jax.Array:
    x = jnp.asarray(x)
    if not jnp.issubdtype(x.dtype, jnp.floating):
      raise ValueError(f'Quantizer needs a float array, got {x.dtype}.')
    if x.ndim == 0:
      raise ValueError('Quantizer needs an array with a last axis, got a '
                       'scalar.')
    if x.size == 0:
      return x
    return _fake_quantize(self, x)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _fake_quantize(q: Quantizer, x: jax.Array) -> jax.Array:
  return q.forward(x)[0].astype(x.dtype)


def _fake_fwd(q, x):
  out, mask = q.forward(x)
  return out.astype(x.dtype), mask


def _fake_bwd(q, mask, g):
  del q
  return (g if mask is None else g * mask.astype(g.dtype),)


_fake_quantize.defvjp(_fake_fwd, _fake_bwd)


def _granularity(granularity) -> str:
  if isinstance(granularity, str):
    granularity = GRANULARITY_ALIASES.get(granularity, granularity)
  return validation.check_choice(
      granularity, 'granularity', GRANULARITIES + tuple(GRANULARITY_ALIASES))


def rtn(bits: int = 4, *, granularity: str = 'row', grid: str = 'midrise',
        gradient: str = 'ste') -> Quantizer:
  """Round-to-nearest symmetric absmax quantization (PTQ; plain-STE QAT).

  The scale of each row (or the tensor) is its absolute maximum, so the
  grid's outer levels are ``+-absmax`` and nothing is clipped. Mid-rise:
  ``step = 2 absmax / (2**bits - 1)``, values at ``(k + 1/2) step``
  (``2**bits`` levels, no zero; the optimizer study's quantizer).
  Mid-tread: ``step = absmax / (2**(bits-1) - 1)``, values at ``k step``.
  The mid-rise grid is odd-symmetric: values at exact level boundaries
  round away from zero, and zero to ``+step/2``. A row of zeros stays zero;
  a row holding a NaN or an infinity comes out NaN. Rows of any finite
  magnitude give finite values (rows scaled by an exact power of two
  first; values below float32's normal range may flush to zero).

  Args:
    bits: 2 to 16.
    granularity: ``'row'`` (alias ``'token'``, ``'channel'``) or
      ``'tensor'``.
    grid: ``'midrise'`` or ``'midtread'``.
    gradient: ``'ste'`` or ``'trust'`` (with absmax scales nothing is
      clipped, so both pass every gradient).

  Returns:
    A [`Quantizer`][optax_q.quant.Quantizer].

  Examples:
    >>> import jax.numpy as jnp
    >>> from optax_q import quant
    >>> quant.rtn(2)(jnp.array([1., -2.5, 3.]))
    Array([ 1., -3.,  3.], dtype=float32)
    >>> quant.rtn(2, grid='midtread')(jnp.array([1., -2.5, 3.]))
    Array([ 0., -3.,  3.], dtype=float32)

  References:
    Vlassis et al, [Beyond Outliers: A Study of Optimizers Under
    Quantization](https://arxiv.org/abs/2509.23500), 2025
  """
  return Quantizer(bits=_check_bits(bits), method='rtn',
                   granularity=_granularity(granularity), grid=grid,
                   gradient=gradient)


def quest(bits: int = 4, *, hadamard_block: int | None = 128,
          granularity: str = 'row', grid: str = 'midrise',
          gradient: str = 'trust') -> Quantizer:
  """QuEST: Hadamard rotation, Gaussian-optimal clipping, trust-mask STE.

  Used on linear layers ([`quantize_linear`][optax_q.quant.quantize_linear]),
  both operands' input dimension is multiplied by a block-diagonal Hadamard
  matrix of ``hadamard_block`` (zero-padded to a multiple of it; the product is
  unchanged since ``H H^T = I``). Each row is then scaled by
  ``c_b * rms(row)`` (QuEST's table, ``c_4 = 2.5139``, else
  [`gaussian_clip`][optax_q.quant.gaussian_clip]), rounded to
  the grid and clipped. The gradient passes only where the value was not
  clipped.

  Args:
    bits: 2 to 16.
    hadamard_block: A power of two (None: no rotation).
    granularity: ``'row'`` (alias ``'token'``, ``'channel'``) or
      ``'tensor'``.
    grid: ``'midrise'`` or ``'midtread'``.
    gradient: ``'trust'`` or ``'ste'``.

  Returns:
    A [`Quantizer`][optax_q.quant.Quantizer].

  Examples:
    >>> import jax, jax.numpy as jnp
    >>> from optax_q import quant
    >>> q = quant.quest(2, hadamard_block=None)
    >>> x = jnp.array([0.1, -0.2, 0.3, 5.0])
    >>> jax.grad(lambda x: q(x).sum())(x)  # 5.0 is clipped
    Array([1., 1., 1., 0.], dtype=float32)

  References:
    Panferov et al, [QuEST: Stable Training of LLMs with 1-Bit Weights and
    Activations](https://arxiv.org/abs/2502.05003), 2025
  """
  return Quantizer(bits=_check_bits(bits), method='quest',
                   granularity=_granularity(granularity), grid=grid,
                   gradient=gradient,
                   hadamard_block=check_hadamard_block(hadamard_block))

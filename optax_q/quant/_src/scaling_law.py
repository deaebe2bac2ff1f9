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
"""Quantization-aware scaling laws ``L = A / (N rho)^alpha + E``.

``rho`` is the parameter efficiency of the quantized models (1 for full
precision): a quantized model of ``N`` parameters is worth ``rho N``
full-precision ones (Kumar et al., 2024; the optimizer study fits it per
optimizer with ``D / N`` fixed). Fitted by a Huber loss on log losses
(Hoffmann et al., 2022) from a grid of starting points, with leave-one-out
intervals.
"""

from __future__ import annotations

import itertools
import math
from typing import NamedTuple

import numpy as np
import numpy.typing as npt

from optax_q._src.core import validation


class ScalingLawFit(NamedTuple):
  """A fitted ``L = a / (N rho)^alpha + e``.

  Attributes:
    a: The coefficient ``A'``.
    alpha: The exponent.
    e: The irreducible loss.
    rho: Parameter efficiency of the quantized points (1.0 when none).
    intervals: ``{'a'|'alpha'|'e'|'rho': (low, high)}``: the range over
      the leave-one-out fits (None with fewer than 5 points).
    residual: Root mean squared log residual of the fit.
  """

  a: float
  alpha: float
  e: float
  rho: float
  intervals: dict[str, tuple[float, float]] | None
  residual: float

  def predict(self, n, quantized=False) -> np.ndarray:
    """The law's loss at ``n`` parameters."""
    n = np.asarray(n, np.float64) * np.where(quantized, self.rho, 1.0)
    return self.a / n**self.alpha + self.e


def _residuals(theta, log_n, quantized, log_l):
  log_a, alpha, e, log_rho = theta
  log_eff = log_n + np.where(quantized, log_rho, 0.0)
  pred = np.exp(log_a - alpha * log_eff) + e
  return np.log(np.maximum(pred, 1e-12)) - log_l


def _fit_once(log_n, quantized, log_l, delta: float):
  floor = float(np.exp(log_l.min()))
  best = None
  for alpha, e_frac, rho in itertools.product(
      (0.1, 0.3, 0.7), (0.0, 0.5, 0.9), (0.5, 0.9)):
    e = e_frac * floor
    log_a = math.log(max(floor - e, 1e-6)) + alpha * float(log_n.mean())
    start = np.array([log_a, alpha, e, math.log(rho)])
    lower = [-np.inf, 1e-4, 0.0, math.log(1e-3)]
    upper = [np.inf, 4.0, floor * (1 - 1e-6), math.log(10.0)]
    if not quantized.any():
      lower[3], upper[3], start[3] = -1e-9, 1e-9, 0.0
    from scipy import optimize  # pylint: disable=g-import-not-at-top
    res = optimize.least_squares(
        _residuals, start, args=(log_n, quantized, log_l), loss='huber',
        f_scale=delta, bounds=(lower, upper))
    if best is None or res.cost < best.cost:
      best = res
  return best.x


def _vector(value, name: str) -> np.ndarray:
  try:
    v = np.asarray(value)
  except (TypeError, ValueError) as e:
    raise ValueError(f'{name} must be a 1-D sequence of numbers.') from e
  if v.ndim != 1 or not np.issubdtype(v.dtype, np.number) or np.issubdtype(
      v.dtype, np.bool_):
    raise ValueError(f'{name} must be a 1-D sequence of numbers, got '
                     f'{validation.short(value)}.')
  return v.astype(np.float64)


def fit_scaling_law(num_params: npt.ArrayLike, loss: npt.ArrayLike,
                    quantized: npt.ArrayLike | None = None, *,
                    huber_delta: float = 1e-3) -> ScalingLawFit:
  """Fits ``L = a / (N rho)^alpha + e`` (``rho`` on quantized points only).

  Args:
    num_params: Parameter counts, one per model.
    loss: Their losses (positive).
    quantized: Booleans, True for the quantized models (None: none; then
      ``rho`` is 1).
    huber_delta: The Huber loss's threshold on log residuals.

  Returns:
    A [`ScalingLawFit`][optax_q.quant.ScalingLawFit].

  The fit is bounded: ``alpha`` in ``(0, 4]``, ``rho`` in ``[1e-3, 10]``,
  ``e`` in ``[0, min(loss))``; a value at a bound says the data do not
  pin it down.

  Raises:
    ValueError: not 1-D numeric sequences, mismatched lengths, fewer than 4
      points or 3 distinct sizes, non-positive or non-finite values, or
      quantized points without a full-precision point.

  Examples:
    >>> import numpy as np
    >>> from optax_q import quant
    >>> n = np.array([1e5, 3e5, 1e6, 1e5, 3e5, 1e6])
    >>> q = np.array([False] * 3 + [True] * 3)
    >>> loss = 50 / (n * np.where(q, 0.8, 1.0)) ** 0.4 + 1.5
    >>> fit = quant.fit_scaling_law(n, loss, q)
    >>> round(fit.rho, 3), round(fit.alpha, 3)
    (0.8, 0.4)

  References:
    Vlassis et al, [Beyond Outliers: A Study of Optimizers Under
    Quantization](https://arxiv.org/abs/2509.23500), 2025;
    Kumar et al, [Scaling Laws for Precision](https://arxiv.org/abs/2411.04330),
    2024
  """
  n, loss = _vector(num_params, 'num_params'), _vector(loss, 'loss')
  if quantized is None:
    quantized = np.zeros(n.shape, bool)
  else:
    quantized = np.asarray(quantized)
    if quantized.ndim != 1 or not (
        quantized.dtype == bool or np.isin(quantized, (0, 1)).all()):
      raise ValueError('quantized must be a 1-D sequence of booleans.')
    quantized = quantized.astype(bool)
  delta = validation.check_number(huber_delta, 'huber_delta', closed='()',
                                 concrete=True)
  if not n.size == loss.size == quantized.size:
    raise ValueError(f'num_params, loss and quantized must have one length, '
                     f'got {n.size}, {loss.size} and {quantized.size}.')
  if n.size < 4:
    raise ValueError(f'fitting needs at least 4 points, got {n.size}.')
  for name, v in (('num_params', n), ('loss', loss)):
    if not (np.all(np.isfinite(v)) and np.all(v > 0)):
      raise ValueError(f'{name} must be finite and positive.')
  if np.unique(n).size < 3:
    raise ValueError(f'fitting needs at least 3 distinct sizes, got '
                     f'{np.unique(n).size}.')
  if quantized.all():
    raise ValueError('quantized points need full-precision points to be '
                     'compared with (rho is relative to them).')
  log_n, log_l = np.log(n), np.log(loss)
  theta = _fit_once(log_n, quantized, log_l, delta)
  resid = _residuals(theta, log_n, quantized, log_l)
  intervals = None
  if n.size >= 5:
    fits = []
    for i in range(n.size):
      keep = np.arange(n.size) != i
      if quantized[keep].all():
        continue
      t = _fit_once(log_n[keep], quantized[keep], log_l[keep], delta)
      fits.append((math.exp(t[0]), t[1], t[2], math.exp(t[3])))
    fits = np.array(fits)
    intervals = {k: (float(fits[:, j].min()), float(fits[:, j].max()))
                 for j, k in enumerate(('a', 'alpha', 'e', 'rho'))}
  return ScalingLawFit(
      a=math.exp(theta[0]), alpha=float(theta[1]), e=float(theta[2]),
      rho=math.exp(theta[3]) if quantized.any() else 1.0,
      intervals=intervals,
      residual=float(np.sqrt(np.mean(resid**2))))

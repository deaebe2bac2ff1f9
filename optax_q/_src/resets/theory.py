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
r"""Stall model of quantized optimizer states and the reset period K*.

A moment stored in a low-precision float grid is read exactly, updated in
fp32 and written back with rounding. When the fp32 increment is smaller than
the local grid spacing the stored value does not change: the update *stalls*.
For the second moment of Adam the stall probability depends only on the
format's epsilon and on ``b2``, through the effective precision ratio

```tex
\hat\rho = \frac{\varepsilon}{2 (1 - \beta_2) \bar m}, \qquad
\bar m = 1 / \ln 2.
```

This module holds the model's small pure functions: the one-step stall
probabilities under nearest and stochastic rounding, the build-up of stalling
after a (re)initialisation, the startup window ``j*``, and the theory-guided
reset period ``K*``. They work on Python floats and are meant to be evaluated
when an optimizer is built, not inside ``jit``.

The model describes the *second moment* (its update-to-spacing ratio does not
depend on the gradient scale). Formats are described by their epsilon
``2**-M``, with ``M`` stored mantissa bits.

References:
  Topollai & Choromanska, [Understanding Quantization of Optimizer States in
  LLM Pre-training: Dynamics of State Staleness and Effectiveness of State
  Resets](https://arxiv.org/abs/2603.16731), 2026
"""

from __future__ import annotations

import math
import reprlib
import statistics
from typing import Any

import numpy as np

from optax_q._src.codec import formats as formats_lib
from optax_q._src.core import validation

ROUNDING_MODES = validation.ROUNDING_MODES

# Stored mantissa bits of the second-moment grids the stall model describes.
# A name means what it means everywhere (``formats.FORMAT_ALIASES``), and the
# model describes the grid a second moment of that format is stored in
# (``formats.unsigned_variant``): 'fp4_e2m1', and so 'fp4', are stored as the
# unsigned E2M2 grid 'fp4_e2m2u' (epsilon 2**-2), which is the paper's FP4
# second moment (rho-hat 86.6 and K* 224 at b2=0.999).
_MANTISSA_BITS = {
    'bf16': 7,
    'fp16': 10,
    'fp8_e4m3': 3,
    'fp8_e5m2': 2,
    'fp4_e2m1': 2,  # Stored as fp4_e2m2u.
    'fp4_e2m2u': 2,
}
# Formats with no mantissa to speak of in this model: integer and table
# grids, and fp32, which is the working precision (nothing is rounded).
_UNSUPPORTED = (
    'fp32', 'float32', 'int8', 'int4', 'int8_dynamic',
    'int8_dynamic_unsigned',
)
SUPPORTED_FORMATS = (
    'bf16', 'fp16', 'fp8_e4m3', 'fp8_e5m2', 'fp4_e2m1', 'fp4_e2m2u', 'fp4',
    'e{E}m{M}', 'ue{E}m{M}',
)
_SUPPORTED_MSG = (
    'The stall model needs a floating-point format with a mantissa; supported:'
    f' {", ".join(SUPPORTED_FORMATS)} (simulated e{{E}}m{{M}} with'
    ' 1 <= E <= 8, 0 <= M <= 23; unsigned ue{E}m{M} with E >= 1, 3 <= E +'
    ' M <= 8), or an object with `name` and an integer'
    ' `mantissa_bits` in [0, 23]. fp32, int8, int4 and int8_dynamic are not'
    ' described.')

# E|z - 1| for z ~ chi-squared(1): 4 phi(1), phi the standard normal density.
_MU1 = 4.0 * math.exp(-0.5) / math.sqrt(2.0 * math.pi)
_MEAN_MANTISSA = 1.0 / math.log(2.0)
_MAX_PERIOD = 10**7
# The longest scan over steps (reset_period's max_period, cycle_staleness's
# period): done in chunks of _CHUNK steps, so memory stays O(1), but the time
# grows with it (about 10 s at this bound).
_MAX_SCAN = 10**8
# Step counts up to here are exact in float64.
_MAX_STEPS = 2**53
_CHUNK = 1 << 15

_erf = np.frompyfunc(math.erf, 1, 1)
_NORMAL = statistics.NormalDist()


# -----------------------------------------------------------------------------
# Argument checks.
# -----------------------------------------------------------------------------


_CONSTRUCTION_HINT = (' (These functions run at construction time; under '
                      'optax.inject_hyperparams pass a Python float.)')


def _open_unit(value: Any, name: str) -> float:
  """``float(value)``, checked to lie in the open interval (0, 1)."""
  return validation.check_number(value, name, low=0.0, high=1.0, closed='()',
                                 concrete=True, hint=_CONSTRUCTION_HINT)


def _check_b2(b2: Any) -> float:
  return _open_unit(b2, 'b2')


def _check_p_init(p_init: Any) -> float:
  return validation.check_number(p_init, 'p_init', low=0.0, high=1.0,
                                 concrete=True, hint=_CONSTRUCTION_HINT)


def _check_steps(value: Any, name: str, minimum: int,
                 maximum: int = _MAX_STEPS, *, scalar: bool = False):
  """Integer step counts in ``[minimum, maximum]`` as int64.

  Python and NumPy integers (and integral floats) are accepted, alone or in
  arrays; bools, strings, NaN, inf and fractions are not. Returns an int64
  array, or a Python int when ``scalar``.
  """
  what = 'an integer' if scalar else 'an integer (or array of integers)'
  bound = {_MAX_STEPS: '2**53', _MAX_SCAN: '10**8'}.get(maximum, maximum)
  want = f'{name} must be {what} in [{minimum}, {bound}]'
  if isinstance(value, (str, bytes, bool, np.bool_)):
    raise ValueError(f'{want}, got {reprlib.repr(value)}.')
  try:
    arr = np.asarray(value)
    if arr.dtype.kind == 'O':  # Python ints beyond int64, or mixed objects.
      arr = arr.astype(np.float64)
  except Exception as e:  # pylint: disable=broad-except
    raise ValueError(
        f'{want}, got {reprlib.repr(value)}. (These functions run at '
        'construction time, on concrete numbers.)') from e
  if scalar and arr.ndim:
    raise ValueError(f'{want}, got an array of shape {arr.shape}.')
  if arr.dtype.kind == 'f':
    if not (np.all(np.isfinite(arr)) and np.all(arr == np.round(arr))):
      raise ValueError(f'{want}, got {reprlib.repr(value)}.')
  elif arr.dtype.kind not in 'iu':
    raise ValueError(f'{want}, got {reprlib.repr(value)}.')
  if arr.size and (np.any(arr < minimum) or np.any(arr > maximum)):
    raise ValueError(f'{want}, got {reprlib.repr(value)}.')
  arr = arr.astype(np.int64)
  return int(arr) if scalar else arr


def _mantissa_bits(fmt: Any) -> int:
  """Stored mantissa bits of ``fmt`` (a name or a format object)."""
  if isinstance(fmt, str):
    # The library's one format parser: every name it accepts, and only those.
    given = fmt
    try:
      fmt = formats_lib.get_format(fmt.strip().lower())
    except ValueError as e:
      raise ValueError(
          f'Unknown fmt {given!r} ({e}) {_SUPPORTED_MSG}') from None
    if fmt.name in _UNSUPPORTED or fmt.mantissa_bits is None:
      raise ValueError(
          f'fmt={given!r} has no mantissa grid the stall model can describe. '
          f'{_SUPPORTED_MSG}')
  name = getattr(fmt, 'name', None)
  if not isinstance(name, str) or not hasattr(fmt, 'mantissa_bits'):
    raise ValueError(
        f'fmt must be a format name or an object with `name` and '
        f'`mantissa_bits`, got {fmt!r}. {_SUPPORTED_MSG}')
  mbits = fmt.mantissa_bits
  if name.strip().lower().endswith('_dre'):
    # Dynamic range expansion: the base grid's steps (its exponent k varies
    # by group and is not known here; k >= 1 only makes the steps finer, so
    # the base grid's period is the shorter, cautious one).
    return _mantissa_bits(name.strip().lower()[:-len('_dre')])
  if name.strip().lower() in _MANTISSA_BITS:
    mbits = _MANTISSA_BITS[name.strip().lower()]  # The stored grid's.
  if name.strip().lower() in _UNSUPPORTED or mbits is None:
    raise ValueError(
        f'fmt={name!r} has no mantissa grid the stall model can describe. '
        f'{_SUPPORTED_MSG}')
  if (isinstance(mbits, bool) or not isinstance(mbits, (int, np.integer))
      or not 0 <= mbits <= 23):
    raise ValueError(
        f'fmt={name!r} has mantissa_bits={mbits!r}; expected an int in '
        f'[0, 23]. {_SUPPORTED_MSG}')
  return int(mbits)


# -----------------------------------------------------------------------------
# chi-squared(1) helpers, in float64.
# -----------------------------------------------------------------------------


def _chi2_cdf(x):
  """CDF of chi-squared(1): ``erf(sqrt(x / 2))``; 0 for ``x <= 0``."""
  if np.ndim(x) == 0:
    x = float(x)
    return math.erf(math.sqrt(x / 2.0)) if x > 0.0 else 0.0
  x = np.maximum(np.asarray(x, np.float64), 0.0)
  return _erf(np.sqrt(x / 2.0)).astype(np.float64)


def _chi2_partial_mean(x: float) -> float:
  """``int_0^x z f(z) dz`` for the chi-squared(1) density ``f``."""
  if x <= 0.0:
    return 0.0
  return _chi2_cdf(x) - math.sqrt(2.0 * x / math.pi) * math.exp(-x / 2.0)


def _chi2_quantile(p: float) -> float:
  """Inverse CDF of chi-squared(1): ``Phi^{-1}((1 + p) / 2) ** 2``."""
  return _NORMAL.inv_cdf((1.0 + p) / 2.0) ** 2


def _nearest_stall(rho: float, phi, asymptotic: bool):
  """NR stall probability with the stall interval scaled by ``phi``."""
  upper = _chi2_cdf(np.multiply(phi, 1.0 + rho))
  if asymptotic or rho >= 1.0:  # For rho >= 1 the lower term is exactly 0.
    return upper
  return upper - _chi2_cdf(np.multiply(phi, 1.0 - rho))


def _phi(j: np.ndarray, b2: float) -> np.ndarray:
  """``1 - b2**j``, accurate for b2 close to 1."""
  return -np.expm1(j * math.log(b2))


# -----------------------------------------------------------------------------
# Public functions.
# -----------------------------------------------------------------------------


def format_epsilon(fmt: Any) -> float:
  """Relative grid spacing ``2**-M`` of a float format with ``M`` mantissa bits.

  For ``x = m 2**e`` with ``m`` in ``[1, 2)`` the spacing of the grid at
  ``x`` is ``ulp(x) = 2**(e - M) = (eps / m) x``.

  Args:
    fmt: A format name (``'bf16'``, ``'fp16'``, ``'fp8_e4m3'``,
      ``'fp8_e5m2'``, ``'fp4_e2m1'``, ``'fp4_e2m2u'``, ``'fp4'``, or a
      simulated ``'e{E}m{M}'``) or an object with attributes ``name`` and
      ``mantissa_bits`` (such as [`optax_q.Format`][optax_q.Format]). The model
      describes the grid a second moment of this format is stored in:
      ``'fp4'`` is ``'fp4_e2m1'`` (as everywhere in the library), and a
      second moment in ``fp4_e2m1`` is stored in the unsigned E2M2 grid
      ``'fp4_e2m2u'`` (the paper's FP4 second moment), so all three have
      ``eps = 2**-2``.

  Returns:
    The epsilon, a Python float.

  Raises:
    ValueError: for formats without a mantissa grid (``fp32``, ``int8``,
      ``int4``, ``int8_dynamic``) and unknown names.

  Examples:
    >>> import optax_q
    >>> optax_q.format_epsilon('bf16')
    0.0078125
    >>> optax_q.format_epsilon('fp4')
    0.25

  References:
    Topollai & Choromanska, [Understanding Quantization of Optimizer States in
    LLM Pre-training: Dynamics of State Staleness and Effectiveness of State
    Resets](https://arxiv.org/abs/2603.16731), 2026
  """
  return 2.0 ** -_mantissa_bits(fmt)


def effective_precision_ratio(fmt: Any, b2: float = 0.999) -> float:
  r"""Effective precision ratio `\hat\rho` of a stored second moment.

  With the mantissa log-uniform on ``[1, 2)`` (mean
  `\bar m = 1/\ln 2`), gradients `g \sim N(0, \sigma^2)`,
  `z = g^2/\sigma^2 \sim \chi^2_1` and a stationary state
  `v \approx \sigma^2`, the ratio of the EMA increment to the local grid
  spacing is `|\Delta|/u \approx |z - 1| / (2\hat\rho)` with

  ```tex
  \hat\rho = \frac{\varepsilon}{2 (1 - \beta_2) \bar m}.
  ```

  The gradient scale cancels: `\hat\rho` depends only on the format and
  `\beta_2`. Large `\hat\rho` means most updates stall.

  Args:
    fmt: The second moment's storage format (see
      [`format_epsilon`][optax_q.format_epsilon]).
    b2: EMA decay rate of the second moment, in ``(0, 1)``.

  Returns:
    `\hat\rho`, a Python float.

  Examples:
    >>> import optax_q
    >>> round(optax_q.effective_precision_ratio('bf16', b2=0.999), 2)
    2.71

  References:
    Topollai & Choromanska, [Understanding Quantization of Optimizer States in
    LLM Pre-training: Dynamics of State Staleness and Effectiveness of State
    Resets](https://arxiv.org/abs/2603.16731), 2026 (Definition 3.2)
  """
  eps = format_epsilon(fmt)
  b2 = _check_b2(b2)
  return eps / (2.0 * (1.0 - b2) * _MEAN_MANTISSA)


def stall_probability(
    fmt: Any,
    b2: float = 0.999,
    rounding: str = 'nearest',
    *,
    asymptotic: bool = False,
) -> float:
  r"""Steady-state probability that one second-moment update stalls.

  A stall is a step whose stored value equals the previous stored value. With
  `z \sim \chi^2_1` and `F` its CDF, round-to-nearest stalls iff
  `|z - 1| < \hat\rho`, and stochastic rounding moves one grid step with
  probability `|\Delta|/u`:

  ```tex
  P_{NR} = F(1 + \hat\rho) - F(\max(0, 1 - \hat\rho)), \qquad
  P_{SR} = \mathbb{E}_z\left[\max\left(0,
    1 - \frac{|z - 1|}{2\hat\rho}\right)\right].
  ```

  `P_{SR}` is evaluated in closed form. With ``asymptotic=True`` the
  large-`\hat\rho` forms are used instead: `P_{NR} \approx
  F(1 + \hat\rho)` and `P_{SR} \approx 1 - \mu_1/(2\hat\rho)`, with
  `\mu_1 = \mathbb{E}|z - 1| = 4\varphi(1)`.

  Args:
    fmt: The second moment's storage format (see
      [`format_epsilon`][optax_q.format_epsilon]).
    b2: EMA decay rate of the second moment, in ``(0, 1)``.
    rounding: ``'nearest'`` or ``'stochastic'``.
    asymptotic: Use the large-`\hat\rho` approximations.

  Returns:
    The stall probability in ``[0, 1]``, a Python float.

  Examples:
    >>> import optax_q
    >>> round(optax_q.stall_probability('bf16', 0.999, 'nearest'), 3)
    0.946
    >>> round(optax_q.stall_probability('bf16', 0.999, 'stochastic'), 3)
    0.825

  References:
    Topollai & Choromanska, [Understanding Quantization of Optimizer States in
    LLM Pre-training: Dynamics of State Staleness and Effectiveness of State
    Resets](https://arxiv.org/abs/2603.16731), 2026 (Propositions 3.3, 5.1)
  """
  rho = effective_precision_ratio(fmt, b2)
  rounding = validation.check_rounding(rounding)
  if rounding == 'nearest':
    return float(_nearest_stall(rho, 1.0, asymptotic))
  if asymptotic:
    return max(0.0, 1.0 - _MU1 / (2.0 * rho))
  c = 1.0 / (2.0 * rho)
  a, b = max(0.0, 1.0 - 2.0 * rho), 1.0 + 2.0 * rho
  f, t = _chi2_cdf, _chi2_partial_mean
  below = (1.0 - c) * (f(1.0) - f(a)) + c * (t(1.0) - t(a))
  above = (1.0 + c) * (f(b) - f(1.0)) - c * (t(b) - t(1.0))
  return min(1.0, max(0.0, below + above))


def effective_decay(
    fmt: Any, b2: float = 0.999, rounding: str = 'nearest') -> float:
  r"""Mean-field effective decay rate of a stalling second moment.

  If each update stalls with probability `P`, the EMA moves on only a
  fraction `1 - P` of the steps, so it forgets more slowly:

  ```tex
  \beta_2^{\text{eff}} \approx 1 - (1 - \beta_2)(1 - P), \qquad
  \tau_{\text{eff}} = \frac{1}{1 - \beta_2^{\text{eff}}}
    = \frac{\tau}{1 - P}.
  ```

  This summary describes nearest-rounding lag; under stochastic rounding the
  stored EMA is unbiased and staleness shows up as variance instead.

  Args:
    fmt: The second moment's storage format (see
      [`format_epsilon`][optax_q.format_epsilon]).
    b2: EMA decay rate of the second moment, in ``(0, 1)``.
    rounding: ``'nearest'`` or ``'stochastic'``.

  Returns:
    `\beta_2^{\text{eff}}`, a Python float.

  Examples:
    >>> import optax_q
    >>> b2_eff = optax_q.effective_decay('bf16', 0.999)
    >>> round(1 / (1 - b2_eff), -2)  # memory in steps, nominally 1000
    18500.0

  References:
    Topollai & Choromanska, [Understanding Quantization of Optimizer States in
    LLM Pre-training: Dynamics of State Staleness and Effectiveness of State
    Resets](https://arxiv.org/abs/2603.16731), 2026 (Eqs. 12-13)
  """
  p = stall_probability(fmt, b2, rounding)
  return 1.0 - (1.0 - float(b2)) * (1.0 - p)


def transient_stall_probability(
    fmt: Any,
    j: int | np.ndarray,
    b2: float = 0.999,
    *,
    p_init: float = 0.0,
    asymptotic: bool = False,
) -> float | np.ndarray:
  r"""Nearest-rounding stall probability ``j`` steps after a (re)initialisation.

  From a zero state the second moment follows
  `\bar v_j = \sigma^2 \phi_j` with `\phi_j = 1 - \beta_2^j`, and
  an update is tested against that smaller scale, so the stall interval is
  centred at `z = \phi_j`:

  ```tex
  P_{NR}(j) = F(\phi_j (1 + \hat\rho)) - F(\max(0, \phi_j (1 - \hat\rho))).
  ```

  The lower term vanishes for `\hat\rho \ge 1` (and is dropped with
  ``asymptotic=True``). An empirical floor `P_{init}` (entries that stall
  from the first step, e.g. zero gradients or values crushed to zero by a
  block scale) gives the total

  ```tex
  P_{total}(j) = P_{init} + (1 - P_{init}) P_{NR}(j).
  ```

  Args:
    fmt: The second moment's storage format (see
      [`format_epsilon`][optax_q.format_epsilon]).
    j: Steps since the (re)initialisation, an int ``>= 0`` or an integer
      array. ``j = 0`` gives ``p_init``.
    b2: EMA decay rate of the second moment, in ``(0, 1)``.
    p_init: Stall floor `P_{init}` in ``[0, 1)``; ``0`` gives the ideal
      `P_{NR}(j)`.
    asymptotic: Use the `\hat\rho \ge 1` form
      `F((1 + \hat\rho)\phi_j)` for every `\hat\rho`.

  Returns:
    `P_{total}(j)`: a Python float for scalar ``j``, else a float64
    array shaped like ``j``. It increases with ``j`` towards
    [`stall_probability`][optax_q.stall_probability] (with the floor applied).

  Examples:
    >>> import optax_q
    >>> p = optax_q.transient_stall_probability('bf16', [1, 100, 10_000])
    >>> [round(float(x), 3) for x in p]
    [0.049, 0.448, 0.946]

  References:
    Topollai & Choromanska, [Understanding Quantization of Optimizer States in
    LLM Pre-training: Dynamics of State Staleness and Effectiveness of State
    Resets](https://arxiv.org/abs/2603.16731), 2026 (Proposition 4.1,
    Eqs. 17-19)
  """
  rho = effective_precision_ratio(fmt, b2)
  p_init = _check_p_init(p_init)
  steps = _check_steps(j, 'j', 0)
  p = _nearest_stall(rho, _phi(steps, float(b2)), asymptotic)
  p = p_init + (1.0 - p_init) * np.asarray(p, np.float64)
  return float(p) if np.ndim(p) == 0 else p


def startup_window(
    fmt: Any,
    b2: float = 0.999,
    p0: float = 0.9,
    *,
    p_init: float = 0.0,
    asymptotic: bool = False,
) -> int | None:
  r"""Startup window `j^*`: steps after a reset to reach stalling ``p0``.

  `j^*(P_0)` is the smallest `j` with
  `P_{total}(j) \ge P_0` (see
  [`transient_stall_probability`][optax_q.transient_stall_probability]). With
  the floor removed, `P_0^{eff} = (P_0 - P_{init})/(1 - P_{init})`, and for
  `\hat\rho \ge 1`

  ```tex
  \phi^* = \frac{F^{-1}(P_0^{eff})}{1 + \hat\rho}, \qquad
  j^* = \left\lceil \frac{\log(1 - \phi^*)}{\log \beta_2} \right\rceil,
  ```

  with `j^* = 0` when `P_0 \le P_{init}`. For
  `\hat\rho < 1` (without ``asymptotic``) `\phi^*` solves the
  general form by bisection. The level is unreachable when it is at or above
  the steady state.

  Args:
    fmt: The second moment's storage format (see
      [`format_epsilon`][optax_q.format_epsilon]).
    b2: EMA decay rate of the second moment, in ``(0, 1)``.
    p0: Stall tolerance `P_0` in ``(0, 1)``.
    p_init: Stall floor `P_{init}` in ``[0, 1)``.
    asymptotic: Use the `\hat\rho \ge 1` form for every
      `\hat\rho`.

  Returns:
    `j^*` as an int, or ``None`` if ``p0`` is never reached.

  Examples:
    >>> import optax_q
    >>> optax_q.startup_window('bf16', 0.999, p0=0.8, p_init=0.17)
    464
    >>> print(optax_q.startup_window('bf16', 0.999, p0=0.95))
    None

  References:
    Topollai & Choromanska, [Understanding Quantization of Optimizer States in
    LLM Pre-training: Dynamics of State Staleness and Effectiveness of State
    Resets](https://arxiv.org/abs/2603.16731), 2026 (Definition 4.2,
    Proposition 4.3)
  """
  rho = effective_precision_ratio(fmt, b2)
  b2 = float(b2)
  p0 = _open_unit(p0, 'p0')
  p_init = _check_p_init(p_init)
  if p0 <= p_init:
    return 0
  target = (p0 - p_init) / (1.0 - p_init)
  if target >= _nearest_stall(rho, 1.0, asymptotic):
    return None
  if asymptotic or rho >= 1.0:
    phi_star = _chi2_quantile(target) / (1.0 + rho)
  else:  # Increasing in phi on [0, 1]: bisect.
    lo, hi = 0.0, 1.0
    for _ in range(200):
      mid = 0.5 * (lo + hi)
      if _nearest_stall(rho, mid, False) < target:
        lo = mid
      else:
        hi = mid
    phi_star = hi
  return max(1, math.ceil(math.log1p(-phi_star) / math.log(b2)))


def _ages(age, b2):
  """``(b2, k, b2**k)`` for checked ``age`` (int64) and ``b2``."""
  b2 = _check_b2(b2)
  k = _check_steps(age, 'age', 1)
  return b2, k, np.power(b2, k.astype(np.float64))


def error_of_power(pk):
  r"""The statistical error `2\beta^K / (1 + \beta^K)` from
  `\beta^K` (NumPy or ``jax.numpy`` arrays alike; Eq. 23)."""
  return 2.0 * pk / (1.0 + pk)


def excess_above(s, s0, xp=np):
  r"""The excess staleness `[(S - s_0) / (1 - s_0)]_+` (Eq. 22).

  One formula for the model (`cycle_staleness`) and for the adaptive
  reset rule, which applies it to the measured stall fraction; ``xp`` is
  ``numpy`` or ``jax.numpy``.
  """
  return xp.maximum((s - s0) / (1.0 - s0), 0.0)


def effective_sample_size(age: int | np.ndarray, b2: float = 0.999
                          ) -> float | np.ndarray:
  r"""Effective sample size of a bias-corrected EMA of local age ``age``.

  With weights `w_t = (1 - \beta_2)\beta_2^{K - t}/(1 - \beta_2^K)`,
  `N = 1/\sum_t w_t^2`:

  ```tex
  N_{stat}(K) = \frac{(1 + \beta_2)(1 - \beta_2^K)}
    {(1 - \beta_2)(1 + \beta_2^K)}
  \xrightarrow{K \to \infty} \frac{1 + \beta_2}{1 - \beta_2}.
  ```

  Args:
    age: Steps since the last reset, an int ``>= 1`` or an integer array.
    b2: EMA decay rate, in ``(0, 1)``.

  Returns:
    `N_{stat}(K)`: a Python float for scalar ``age``, else an array.

  Examples:
    >>> import optax_q
    >>> optax_q.effective_sample_size(1, 0.999)
    1.0

  References:
    Topollai & Choromanska, [Understanding Quantization of Optimizer States in
    LLM Pre-training: Dynamics of State Staleness and Effectiveness of State
    Resets](https://arxiv.org/abs/2603.16731), 2026 (Eq. 23)
  """
  b2, k, pk = _ages(age, b2)
  n = (1.0 + b2) * _phi(k, b2) / ((1.0 - b2) * (1.0 + pk))
  return float(n) if np.ndim(n) == 0 else n


def statistical_error(age: int | np.ndarray, b2: float = 0.999
                      ) -> float | np.ndarray:
  r"""Relative statistical error of a bias-corrected EMA of local age ``age``.

  The loss of effective sample size against an EMA that was never reset:

  ```tex
  E(K) = 1 - \frac{N_{stat}(K)}{N_\infty} = \frac{2\beta_2^K}{1 + \beta_2^K}.
  ```

  It decreases from ``1`` at ``K = 0`` towards ``0``; a reset restarts it.

  Args:
    age: Steps since the last reset, an int ``>= 1`` or an integer array.
    b2: EMA decay rate, in ``(0, 1)``.

  Returns:
    `E(K)`: a Python float for scalar ``age``, else an array.

  Examples:
    >>> import optax_q
    >>> round(optax_q.statistical_error(1000, 0.999), 3)
    0.538

  References:
    Topollai & Choromanska, [Understanding Quantization of Optimizer States in
    LLM Pre-training: Dynamics of State Staleness and Effectiveness of State
    Resets](https://arxiv.org/abs/2603.16731), 2026 (Eq. 23)
  """
  _, _, pk = _ages(age, b2)
  e = error_of_power(pk)
  return float(e) if np.ndim(e) == 0 else e


def _normalized_excess(
    rho: float, b2: float, s0: float, j: np.ndarray, asymptotic: bool,
) -> np.ndarray:
  """``[(S(j) - s0) / (1 - s0)]_+`` with ``S(j) = P_NR(j) / P_ss``."""
  p_ss = _nearest_stall(rho, 1.0, asymptotic)
  s = _nearest_stall(rho, _phi(j, b2), asymptotic) / p_ss
  return excess_above(s, s0)


def cycle_staleness(
    fmt: Any,
    period: int,
    b2: float = 0.999,
    s0: float = 0.6,
    *,
    asymptotic: bool = False,
) -> float:
  r"""Cycle-averaged excess staleness `\bar S_{s_0}(K)` of a reset cycle.

  The normalised, reset-sensitive progress of stalling is
  `S(j) = P_{NR}(j)/P_{ss}` (a floor `P_{init}` cancels), and its
  excess above the tolerance `s_0`, averaged over a cycle of ``K``
  steps, is

  ```tex
  \bar S_{s_0}(K) = \frac{1}{K}\sum_{j=1}^{K}
    \left[\frac{S(j) - s_0}{1 - s_0}\right]_+.
  ```

  Args:
    fmt: The second moment's storage format (see
      [`format_epsilon`][optax_q.format_epsilon]).
    period: Reset period `K`, an int in ``[1, 10**8]``. The sum is
      taken in chunks (constant memory); once `\beta_2^j` is below
      ``2**-60`` its terms are constant and summed at once.
    b2: EMA decay rate of the second moment, in ``(0, 1)``.
    s0: Staleness tolerance `s_0` in ``(0, 1)``.
    asymptotic: Use the `\hat\rho \ge 1` form for every
      `\hat\rho`.

  Returns:
    `\bar S_{s_0}(K)` in ``[0, 1]``, a Python float.

  Raises:
    ValueError: naming the argument, for a ``period`` that is not an
      integer in ``[1, 10**8]``, or a bad ``fmt``, ``b2`` or ``s0``.

  Examples:
    >>> import optax_q
    >>> round(optax_q.cycle_staleness('bf16', 1116), 3)
    0.494

  References:
    Topollai & Choromanska, [Understanding Quantization of Optimizer States in
    LLM Pre-training: Dynamics of State Staleness and Effectiveness of State
    Resets](https://arxiv.org/abs/2603.16731), 2026 (Eq. 22)
  """
  rho = effective_precision_ratio(fmt, b2)
  b2 = float(b2)
  s0 = _open_unit(s0, 's0')
  k = _check_steps(period, 'period', 1, _MAX_SCAN, scalar=True)
  # Once b2**j < 2**-60, phi_j = 1 - b2**j rounds to 1 and every later term
  # equals the steady-state one: sum the rest in one product.
  flat = max(1, math.ceil(-60.0 * math.log(2.0) / math.log(b2)))
  total = 0.0
  for start in range(1, min(k, flat) + 1, _CHUNK):  # O(_CHUNK) memory.
    j = np.arange(start, min(start + _CHUNK, k + 1, flat + 1), dtype=np.int64)
    total += float(np.sum(_normalized_excess(rho, b2, s0, j, asymptotic)))
  if k > flat:
    tail = _normalized_excess(rho, b2, s0, np.array([flat]), asymptotic)
    total += (k - flat) * float(tail[0])
  return total / k


def reset_period(
    fmt: Any,
    b2: float = 0.999,
    s0: float = 0.6,
    *,
    asymptotic: bool = False,
    max_period: int = _MAX_PERIOD,
) -> int:
  r"""Theory-guided reset period `K^*` of a quantized second moment.

  Resetting too often costs statistical efficiency (the bias-corrected EMA
  averages fewer gradients, [`statistical_error`][optax_q.statistical_error]);
  resetting too rarely lets staleness build up
  ([`cycle_staleness`][optax_q.cycle_staleness]). `K^*` is where the rising
  excess staleness first catches up with the falling error:

  ```tex
  K^* = \min\left\{K \ge 1 : \bar S_{s_0}(K) \ge
    \frac{2\beta_2^K}{1 + \beta_2^K}\right\}.
  ```

  The left side is nondecreasing and the right side decreasing, so the
  crossing is unique; it is found by a linear scan. The rule is derived for
  nearest rounding and is used as a proxy under stochastic rounding.

  `S(j)` is normalised by the steady state, so a finite `K^*` is
  returned even where the absolute stall rate is low (e.g. bf16 at
  ``b2 <= 0.99``, where [`stall_probability`][optax_q.stall_probability] is
  below 0.15) and resets are not indicated; check
  [`stall_probability`][optax_q.stall_probability] before enabling resets.

  Args:
    fmt: The second moment's storage format (see
      [`format_epsilon`][optax_q.format_epsilon]). ``'fp4'`` (= ``'fp4_e2m1'``)
      means the paper's FP4 (unsigned E2M2 second moment, ``eps = 2**-2``).
    b2: EMA decay rate of the second moment, in ``(0, 1)``.
    s0: Staleness tolerance `s_0` in ``(0, 1)``; the paper uses 0.6.
    asymptotic: Use the paper's `\hat\rho \ge 1` form
      `P(j) \approx F((1 + \hat\rho)(1 - \beta_2^j))` for every
      `\hat\rho` (it differs from the default only where
      `\hat\rho < 1`).
    max_period: Give up (``ValueError``) beyond this many steps, an int in
      ``[1, 10**8]``.

  Returns:
    `K^*`, a Python int.

  Examples:
    >>> import optax_q
    >>> [optax_q.reset_period(f) for f in ('bf16', 'fp8_e4m3', 'fp4')]
    [1116, 320, 224]

  References:
    Topollai & Choromanska, [Understanding Quantization of Optimizer States in
    LLM Pre-training: Dynamics of State Staleness and Effectiveness of State
    Resets](https://arxiv.org/abs/2603.16731), 2026 (Proposition 5.2)
  """
  rho = effective_precision_ratio(fmt, b2)
  b2 = float(b2)
  s0 = _open_unit(s0, 's0')
  max_period = _check_steps(max_period, 'max_period', 1, _MAX_SCAN,
                            scalar=True)
  total = 0.0
  for start in range(1, max_period + 1, _CHUNK):
    k = np.arange(start, min(start + _CHUNK, max_period + 1), dtype=np.int64)
    excess = _normalized_excess(rho, b2, s0, k, asymptotic)
    mean = (total + np.cumsum(excess)) / k
    pk = np.exp(k * math.log(b2))
    hit = np.flatnonzero(mean >= 2.0 * pk / (1.0 + pk))
    if hit.size:
      return int(k[hit[0]])
    total += float(np.sum(excess))
  raise ValueError(
      f'No reset period up to max_period={max_period} for fmt={fmt!r}, '
      f'b2={b2!r}; raise max_period (b2 very close to 1 needs periods of '
      'many times 1 / (1 - b2)).')

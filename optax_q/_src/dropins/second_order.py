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
"""Shampoo and SOAP with low-bit, resettable state: the storage wiring.

`optax_q.shampoo` and `optax_q.soap` are their ``scale_by_*``
transform wrapped in `quantize_state` (a format per statistic),
optionally in `reset_state` (moments reset to zero, factor statistics
to a scaled identity, with local-age bias correction), then decoupled
weight decay and the learning rate. This module holds what the two share.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jax
import optax

from optax_q._src.codec import formats as formats_lib
from optax_q._src.codec import qarray as qarray_lib
from optax_q._src.core import validation
from optax_q._src.resets import resets
from optax_q._src.second_order import shampoo as shampoo_lib
from optax_q._src.second_order import soap as soap_lib
from optax_q._src.state import transform

# Eigenbases are orthogonal matrices: an entry of a 64 x 64 basis is about
# 1/8, its error must stay well below that for one Björck iteration to
# bring the basis back (4-bit Shampoo's smallest).
MIN_EIGVECS_BITS = 4
MOMENTS = ('mu', 'nu')
STATISTICS = ('stats_l', 'stats_r')
EIGVECS = ('eigvecs_l', 'eigvecs_r')
EIGVALS = ('eigvals_l', 'eigvals_r')
# One scale per row of a statistic held in its eigenbasis: one per
# eigen-direction (see ``preconditioner``).
STATS_SCALE_MODE = 'row'


def check_eigvecs_format(fmt: Any, name: str = 'eigvecs_format'
                         ) -> formats_lib.Format:
  """A format an eigenbasis can be stored in: signed, >= 4 bits."""
  fmt = formats_lib.check_signed_format(fmt, name)
  if fmt.bits < MIN_EIGVECS_BITS:
    raise ValueError(
        f'{name}={fmt.name!r} has {fmt.bits} bits; eigenbases need at least '
        f'{MIN_EIGVECS_BITS} (int4, nf4, fp4_e2m1, int8, fp8, bf16, fp32), '
        'or orthogonal rectification cannot recover them.')
  return fmt


def _periods(reset_every: Any, fields: tuple[str, ...]) -> dict[str, Any]:
  """``{field: period}`` of the fields reset (an int for all, or a dict
  keyed by ``'mu'``, ``'nu'`` and ``'stats'``)."""
  if reset_every is None:
    return {}
  if not isinstance(reset_every, Mapping):
    period = validation.check_int(reset_every, 'reset_every', low=1,
                                  high=validation.MAX_PERIOD)
    return {f: period for f in fields}
  allowed = ('mu', 'nu', 'stats')
  out = {}
  for key, period in validation.check_field_map(
      reset_every, 'reset_every', lambda k, p: p, 'a dict').items():
    if key not in allowed:
      raise ValueError(
          f'reset_every has key {key!r}; allowed keys: {allowed}.')
    if period is None:
      continue
    period = validation.check_int(period, f'reset_every[{key!r}]', low=1,
                                  high=validation.MAX_PERIOD)
    if key == 'nu' and 'nu' not in fields:
      raise ValueError(
          "reset_every has key 'nu', but this optimizer keeps no second "
          "moment (grafting other than 'adam').")
    for f in (STATISTICS if key == 'stats' else (key,)):
      out[f] = period
  return out


def _build(scale_by: Any, transform_args: dict[str, Any], *,
           learning_rate: Any, weight_decay: Any, weight_decay_mask: Any,
           mu_format: Any, nu_format: Any, stats_format: Any,
           eigvecs_format: Any, rounding: str, block_size: Any, seed: Any,
           min_size: Any, reset_every: Any, track_stalls: bool,
           has_nu: bool = True, has_eigvals: bool = False
           ) -> optax.GradientTransformation:
  """``scale_by(**transform_args)`` stored in the formats, maybe reset, then
  weight decay and the learning rate."""
  stats = formats_lib.check_signed_format(stats_format, 'stats_format')
  eig = check_eigvecs_format(eigvecs_format)
  formats = {
      'mu': formats_lib.check_signed_format(mu_format, 'mu_format'),
      'nu': formats_lib.check_second_moment_format(nu_format, 'nu_format'),
      'stats_l': stats, 'stats_r': stats, 'eigvecs_l': eig, 'eigvecs_r': eig,
  }
  # One Björck iteration when the bases are stored quantized.
  inner = scale_by(**transform_args, rectify_steps=0 if all(
      formats[f].is_identity for f in EIGVECS) else 1)
  validation.check_number(learning_rate, 'learning_rate', schedule=True)
  validation.check_number(weight_decay, 'weight_decay')
  rounding = validation.check_rounding(
      rounding, modes=validation.STATE_ROUNDING_MODES)
  if not has_nu:
    formats = {f: v for f, v in formats.items() if f != 'nu'}
    if rounding == 'preconditioner':
      raise ValueError(
          "rounding='preconditioner' rounds Adam grafting's second moment, "
          'and this grafting keeps none: use grafting=\'adam\', or '
          "rounding='stochastic'.")
  # Rounding in preconditioner space is for the Adam second moment (its
  # eps declared); the other fields round stochastically then.
  linear = 'stochastic' if rounding == 'preconditioner' else rounding
  stored = transform.quantize_state(
      inner, formats,
      rounding={f: 'nearest' if f in EIGVECS else
                rounding if f == 'nu' else linear for f in formats},
      preconditioner=({'nu': transform_args['eps']}
                      if has_nu and rounding == 'preconditioner' else None),
      seed=seed, min_size=min_size, block_size=block_size,
      scale_mode={f: STATS_SCALE_MODE for f in STATISTICS
                  if qarray_lib.default_scale_mode(formats[f]) != 'none'}
      or None,
      track_stalls=track_stalls, nonnegative_fields=(('nu',) if has_nu else ())
      + (EIGVALS if has_eigvals else ()))
  fields = tuple(f for f in MOMENTS + STATISTICS if f in formats)
  periods = _periods(reset_every, fields)
  beta = transform_args['shampoo_beta']
  if beta is None:
    beta = transform_args['b2']
  if periods and not 0 < float(beta) < 1:
    raise ValueError(
        f'reset_every needs the factor statistics\' decay (shampoo_beta, or '
        f'b2 when it is None) in (0, 1), got {beta}: the identity a '
        'statistic is reset to is weighted by 1 - decay.')
  if periods:
    groups = [tuple(f for f in STATISTICS if f in periods)]
    moments = [f for f in MOMENTS if f in periods]
    if len(moments) == 2 and periods['mu'] == periods['nu']:
      groups.append(tuple(moments))
    stored = resets.reset_state(
        stored, periods, groups=tuple(g for g in groups if len(g) > 1),
        decay=beta, reset_to={f: 'identity' for f in STATISTICS
                              if f in periods})
  return optax.chain(
      stored, optax.add_decayed_weights(weight_decay, weight_decay_mask),
      optax.scale_by_learning_rate(learning_rate))


def shampoo(
    learning_rate: optax.ScalarOrSchedule,
    b1: jax.typing.ArrayLike = 0.9,
    b2: jax.typing.ArrayLike = 0.999,
    eps: jax.typing.ArrayLike = 1e-8,
    weight_decay: jax.typing.ArrayLike = 0.0,
    weight_decay_mask: Any = None,
    *,
    max_preconditioner_dim: int | None = None,
    precondition_frequency: int | None = None,
    shampoo_beta: jax.typing.ArrayLike | None = None,
    matrix_eps: float = 1e-6,
    grafting: str = 'adam',
    mu_format: str | formats_lib.Format = 'int8_dynamic',
    nu_format: str | formats_lib.Format = 'int8_dynamic',
    stats_format: str | formats_lib.Format = 'int8',
    eigvecs_format: str | formats_lib.Format = 'int8',
    rounding: str = 'stochastic',
    block_size: int | None = None,
    seed: int | None = None,
    min_size: int | None = None,
    reset_every: int | dict[str, int | None] | None = None,
    track_stalls: bool = False,
) -> optax.GradientTransformation:
  r"""Shampoo with Adam grafting and low-bit, resettable statistics.

  [`scale_by_shampoo`][optax_q.scale_by_shampoo] stored by
  [`quantize_state`][optax_q.quantize_state], each field in its own format: the
  gradients' EMA in ``mu_format``, Adam grafting's second moment in
  ``nu_format`` (its unsigned variant), the factor statistics in
  ``stats_format`` with one scale per row (they are held in their eigenbasis, so
  a row is an eigen-direction), the eigenbases in ``eigvecs_format`` rounded to
  nearest and rectified by one Björck iteration on use (Wang et al., 2024); the
  eigenvalues stay float32. Then decoupled weight decay and the learning rate.
  With ``'fp32'`` formats it is ``scale_by_shampoo`` chained with
  ``optax.add_decayed_weights`` and ``optax.scale_by_learning_rate``.

  A step reads the state `x` of ``scale_by_shampoo`` from storage, runs
  it in float32 and stores it again:

  ```tex
  (d_t, x_t) = \mathrm{shampoo}\big(g_t, \mathcal{D}(\hat x_{t-1})\big),
  \qquad \hat x_t = \mathcal{Q}(x_t), \qquad
  u_t = -\eta_t\, (d_t + \lambda w),
  ```

  where `\mathrm{shampoo}` is the step of
  [`scale_by_shampoo`][optax_q.scale_by_shampoo] (its equations are given
  there), `\mathcal{Q}` encodes each field in its format (the `Q` of
  [`quantize_state`][optax_q.quantize_state]: the bases rounded to nearest,
  the other fields with ``rounding``; the eigenvalues kept), `\mathcal{D}`
  decodes it, `\eta_t` is the learning rate and `\lambda` =
  ``weight_decay``. A decoded basis is first brought back to orthogonal by
  one Björck iteration `Q \leftarrow Q (3 I - Q^\top Q) / 2` (none when
  ``eigvecs_format`` is ``'fp32'``).

  ``reset_every`` resets the moments to zero and the factor statistics to
  a scaled identity (see [`reset_state`][optax_q.reset_state]'s ``reset_to``),
  each with its local-age bias correction: the staleness paper's practice for
  SOAP's statistics (Topollai & Choromanska, 2026). After the `K`-th update
  of a field since its last reset (`K` its period, `n` the side of a block's
  statistic `S`, `\beta` = ``shampoo_beta``, or ``b2`` when None):

  ```tex
  m,\ v \leftarrow 0, \qquad
  S \leftarrow (1 - \beta)\, \frac{\mathrm{tr}\, S}{n}\, I, \qquad
  k \leftarrow 0,
  ```

  with `k` the field's local age in its bias correction.

  Args:
    learning_rate: A float or an Optax schedule.
    b1: EMA decay of the gradients, in [0, 1).
    b2: Adam grafting's second-moment decay, in [0, 1).
    eps: Adam grafting's epsilon, >= 0.
    weight_decay: Decoupled weight decay, >= 0.
    weight_decay_mask: As in ``optax.add_decayed_weights``.
    max_preconditioner_dim: Largest block side, an int in [1, 65536];
      None: 1024.
    precondition_frequency: Updates between refreshes, an int >= 1; None:
      20. (None defaults stay static under ``optax.inject_hyperparams``.)
    shampoo_beta: EMA decay of the factor statistics; None: ``b2``.
    matrix_eps: Eigenvalue floor relative to the largest, in (0, 1].
    grafting: ``'adam'``, ``'sgd'`` or ``'none'``.
    mu_format: Format of the gradients' EMA; signed.
    nu_format: Format of Adam grafting's second moment (not the
      first-moment grids ``'nf4'`` and ``'nf3'``).
    stats_format: Format of the factor statistics; signed (their
      off-diagonal entries are).
    eigvecs_format: Format of the eigenbases; signed, at least 4 bits.
    rounding: ``'stochastic'``, ``'nearest'`` or ``'preconditioner'`` (the
      second moment rounded so that ``1/(sqrt(nu) + eps)`` is unbiased,
      see [`in_preconditioner_space`][optax_q.in_preconditioner_space])
      for the moments and
      statistics (the bases always round to nearest).
    block_size: Elements per scale of block-scaled formats; None: 128.
    seed: Seed of the stochastic rounding; None: 0.
    min_size: Leaves with fewer elements stay float32; None: 4096.
    reset_every: None (no resets), a period for the moments and the
      statistics, or a dict ``{'mu' | 'nu' | 'stats': period or None}``.
    track_stalls: Record the stalled fraction of each quantized leaf.

  Returns:
    An Optax gradient transformation.

  Raises:
    ValueError: at construction, naming the bad argument and the allowed
      values.

  Examples:
    >>> import jax.numpy as jnp, optax_q
    >>> params = {'w': jnp.zeros((256, 256)), 'b': jnp.zeros(256)}
    >>> tx = optax_q.shampoo(1e-3, max_preconditioner_dim=128)
    >>> state = tx.init(params)
    >>> fp32 = optax_q.scale_by_shampoo(max_preconditioner_dim=128)
    >>> ratio = optax_q.state_nbytes(state) / optax_q.state_nbytes(
    ...     fp32.init(params))
    >>> round(ratio, 2)
    0.26

  References:
    Gupta et al, [Shampoo: Preconditioned Stochastic Tensor
    Optimization](https://arxiv.org/abs/1802.09568), 2018

    Wang et al, [4-bit Shampoo for Memory-Efficient Network
    Training](https://arxiv.org/abs/2405.18144), 2024

    Topollai & Choromanska, [Understanding Quantization of Optimizer States
    in LLM Pre-training](https://arxiv.org/abs/2603.16731), 2026
  """
  return _build(
      shampoo_lib.scale_by_shampoo,
      dict(b1=b1, b2=b2, eps=eps,
           max_preconditioner_dim=max_preconditioner_dim,
           precondition_frequency=precondition_frequency,
           shampoo_beta=shampoo_beta, matrix_eps=matrix_eps,
           grafting=grafting),
      learning_rate=learning_rate, weight_decay=weight_decay,
      weight_decay_mask=weight_decay_mask, mu_format=mu_format,
      nu_format=nu_format, stats_format=stats_format,
      eigvecs_format=eigvecs_format, rounding=rounding, block_size=block_size,
      seed=seed, min_size=min_size, reset_every=reset_every,
      track_stalls=track_stalls, has_nu=grafting == 'adam',
      has_eigvals=True)


def soap(
    learning_rate: optax.ScalarOrSchedule,
    b1: jax.typing.ArrayLike = 0.95,
    b2: jax.typing.ArrayLike = 0.95,
    eps: jax.typing.ArrayLike = 1e-8,
    weight_decay: jax.typing.ArrayLike = 0.0,
    weight_decay_mask: Any = None,
    *,
    max_preconditioner_dim: int | None = None,
    precondition_frequency: int | None = None,
    shampoo_beta: jax.typing.ArrayLike | None = None,
    mu_format: str | formats_lib.Format = 'int8_dynamic',
    nu_format: str | formats_lib.Format = 'int8_dynamic',
    stats_format: str | formats_lib.Format = 'int8',
    eigvecs_format: str | formats_lib.Format = 'int8',
    rounding: str = 'stochastic',
    block_size: int | None = None,
    seed: int | None = None,
    min_size: int | None = None,
    reset_every: int | dict[str, int | None] | None = None,
    track_stalls: bool = False,
) -> optax.GradientTransformation:
  r"""SOAP with low-bit, resettable state.

  [`scale_by_soap`][optax_q.scale_by_soap] stored by
  [`quantize_state`][optax_q.quantize_state], each field in its own format:
  Adam's moments (in the rotated coordinates) in ``mu_format`` and
  ``nu_format``, the factor statistics in ``stats_format`` with one scale per
  row, the eigenbases in ``eigvecs_format`` rounded to nearest and rectified by
  one Björck iteration on use. Then decoupled weight decay and the learning
  rate. With ``'fp32'`` formats it is ``scale_by_soap`` chained with
  ``optax.add_decayed_weights`` and ``optax.scale_by_learning_rate``.

  A step reads the state `x` of ``scale_by_soap`` from storage, runs it
  in float32 and stores it again:

  ```tex
  (d_t, x_t) = \mathrm{soap}\big(g_t, \mathcal{D}(\hat x_{t-1})\big),
  \qquad \hat x_t = \mathcal{Q}(x_t), \qquad
  u_t = -\eta_t\, (d_t + \lambda w),
  ```

  where `\mathrm{soap}` is the step of
  [`scale_by_soap`][optax_q.scale_by_soap] (its equations are given there),
  `\mathcal{Q}` encodes each field in its format (the `Q` of
  [`quantize_state`][optax_q.quantize_state]: the bases rounded to nearest,
  the other fields with ``rounding``), `\mathcal{D}` decodes it, `\eta_t`
  is the learning rate and `\lambda` = ``weight_decay``. A decoded basis
  is first brought back to orthogonal by one Björck iteration
  `Q \leftarrow Q (3 I - Q^\top Q) / 2` (none when ``eigvecs_format`` is
  ``'fp32'``); between refreshes the decoded basis is stored back as it
  was decoded.

  ``reset_every`` resets the moments to zero and the factor statistics to
  a scaled identity, with local-age bias correction (as for
  [`shampoo`][optax_q.shampoo]: `m, v \leftarrow 0`,
  `S \leftarrow (1 - \beta)\, (\mathrm{tr}\, S / n)\, I`); the
  staleness paper resets SOAP's statistics with the moments' period, which
  makes FP8 SOAP train (its Table 7; Topollai & Choromanska, 2026).

  Args:
    learning_rate: A float or an Optax schedule.
    b1: First-moment decay, in [0, 1).
    b2: Second-moment decay, in [0, 1).
    eps: Adam's epsilon, >= 0.
    weight_decay: Decoupled weight decay, >= 0.
    weight_decay_mask: As in ``optax.add_decayed_weights``.
    max_preconditioner_dim: Largest block side, an int in [1, 65536];
      None: 1024.
    precondition_frequency: Updates between refreshes, an int >= 1; None:
      10. (None defaults stay static under ``optax.inject_hyperparams``.)
    shampoo_beta: EMA decay of the factor statistics; None: ``b2``.
    mu_format: Format of the first moment; signed.
    nu_format: Format of the second moment (not the first-moment grids
      ``'nf4'`` and ``'nf3'``).
    stats_format: Format of the factor statistics; signed.
    eigvecs_format: Format of the eigenbases; signed, at least 4 bits.
    rounding: ``'stochastic'``, ``'nearest'`` or ``'preconditioner'`` (the
      second moment rounded so that ``1/(sqrt(nu) + eps)`` is unbiased,
      see [`in_preconditioner_space`][optax_q.in_preconditioner_space])
      for the moments and
      statistics (the bases always round to nearest).
    block_size: Elements per scale of block-scaled formats; None: 128.
    seed: Seed of the stochastic rounding; None: 0.
    min_size: Leaves with fewer elements stay float32; None: 4096.
    reset_every: None (no resets), a period for the moments and the
      statistics, or a dict ``{'mu' | 'nu' | 'stats': period or None}``.
    track_stalls: Record the stalled fraction of each quantized leaf.

  Returns:
    An Optax gradient transformation.

  Raises:
    ValueError: at construction, naming the bad argument and the allowed
      values.

  Examples:
    >>> import jax.numpy as jnp, optax_q
    >>> params = {'w': jnp.zeros((256, 256)), 'b': jnp.zeros(256)}
    >>> tx = optax_q.soap(3e-3, max_preconditioner_dim=128,
    ...                   stats_format='fp8_e4m3', eigvecs_format='fp8_e4m3',
    ...                   mu_format='fp8_e4m3', nu_format='fp8_e4m3',
    ...                   reset_every=300)
    >>> state = tx.init(params)

  References:
    Vyas et al, [SOAP: Improving and Stabilizing Shampoo using
    Adam](https://arxiv.org/abs/2409.11321), 2024

    Topollai & Choromanska, [Understanding Quantization of Optimizer States
    in LLM Pre-training](https://arxiv.org/abs/2603.16731), 2026
  """
  return _build(
      soap_lib.scale_by_soap,
      dict(b1=b1, b2=b2, eps=eps,
           max_preconditioner_dim=max_preconditioner_dim,
           precondition_frequency=precondition_frequency,
           shampoo_beta=shampoo_beta),
      learning_rate=learning_rate, weight_decay=weight_decay,
      weight_decay_mask=weight_decay_mask, mu_format=mu_format,
      nu_format=nu_format, stats_format=stats_format,
      eigvecs_format=eigvecs_format, rounding=rounding, block_size=block_size,
      seed=seed, min_size=min_size, reset_every=reset_every,
      track_stalls=track_stalls)

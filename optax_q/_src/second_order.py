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

import optax

from optax_q._src import formats as formats_lib
from optax_q._src import qarray as qarray_lib
from optax_q._src import resets
from optax_q._src import transform
from optax_q._src import validation

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


def field_formats(*, mu_format, nu_format, stats_format, eigvecs_format
                  ) -> dict[str, formats_lib.Format]:
  """``{field: Format}`` for every stored field (checked)."""
  stats = formats_lib.check_signed_format(stats_format, 'stats_format')
  eig = check_eigvecs_format(eigvecs_format)
  return {
      'mu': formats_lib.check_signed_format(mu_format, 'mu_format'),
      'nu': formats_lib.check_second_moment_format(nu_format, 'nu_format'),
      'stats_l': stats, 'stats_r': stats, 'eigvecs_l': eig, 'eigvecs_r': eig,
  }


def rectify_steps(formats: Mapping[str, formats_lib.Format]) -> int:
  """One Björck iteration when the bases are stored quantized."""
  return 0 if all(formats[f].is_identity for f in EIGVECS) else 1


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


def build(inner: optax.GradientTransformation, *, learning_rate: Any,
          weight_decay: Any, weight_decay_mask: Any,
          formats: dict[str, formats_lib.Format], rounding: str,
          block_size: Any, seed: Any, min_size: Any, reset_every: Any,
          beta: Any, track_stalls: bool, has_nu: bool = True,
          has_eigvals: bool = False
          ) -> optax.GradientTransformation:
  """``inner`` stored in ``formats``, maybe reset, then weight decay and
  the learning rate."""
  validation.check_number(learning_rate, 'learning_rate', schedule=True)
  validation.check_number(weight_decay, 'weight_decay')
  rounding = validation.check_rounding(rounding)
  if not has_nu:
    formats = {f: v for f, v in formats.items() if f != 'nu'}
  stored = transform.quantize_state(
      inner, formats,
      rounding={f: 'nearest' if f in EIGVECS else rounding for f in formats},
      seed=seed, min_size=min_size, block_size=block_size,
      scale_mode={f: STATS_SCALE_MODE for f in STATISTICS
                  if qarray_lib.default_scale_mode(formats[f]) != 'none'}
      or None,
      track_stalls=track_stalls, nonnegative_fields=(('nu',) if has_nu else ())
      + (EIGVALS if has_eigvals else ()))
  fields = tuple(f for f in MOMENTS + STATISTICS if f in formats)
  periods = _periods(reset_every, fields)
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

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
"""The four quantized components of training: gradients, weights, moments.

Tang et al. (2025) analyse Adam and Muon with floating-point quantization
of the gradients (``q_G``), of the weights the forward pass sees
(``q_W``; the master weights stay in float32), and of the stored first and
second moments (``q_M``, ``q_V``), each set independently.
:func:`quantized_training` holds the four formats and builds the pieces
from the library's own parts: :func:`quantize_gradients` first in the
chain, :func:`quantize_state` around the optimizer, and
:func:`fake_quantize_params` for the forward weights.
"""

from __future__ import annotations

from collections.abc import Mapping
import dataclasses
from typing import Any

import jax
import optax

from optax_q._src import formats as formats_lib
from optax_q._src import gradients
from optax_q._src import qarray as qarray_lib
from optax_q._src import state_tree
from optax_q._src import transform
from optax_q._src import validation
from optax_q._src import weights

# The components, in the paper's order of notation: gradients, weights,
# first moment, second moment.
COMPONENTS = ('g', 'w', 'm', 'v')
# State fields that hold each moment (Adam, Muon and Lion: mu; SGD with
# momentum: trace; Adam: nu).
MOMENT_FIELDS = {'m': ('mu', 'trace'), 'v': ('nu',)}
Formats = str | formats_lib.Format | Mapping[str, Any] | None


def _check_components(value: Any, name: str, check) -> dict[str, Any]:
  """``{component: check(v)}`` from one value for all or a mapping."""
  if not isinstance(value, Mapping):
    return {c: check(value, c) for c in COMPONENTS}
  unknown = sorted(str(k) for k in value if k not in COMPONENTS)
  if unknown:
    raise ValueError(
        f'{name} has unknown components {unknown}; the components are '
        f"{COMPONENTS} ('g' gradients, 'w' weights, 'm' first moment, "
        "'v' second moment).")
  return {c: check(value.get(c), c) for c in COMPONENTS}


def _check_format(value: Any, component: str) -> formats_lib.Format | None:
  if value is None:
    return None
  name = f'formats[{component!r}]'
  if component == 'v':
    return formats_lib.check_format(value, name)
  return gradients.check_signed_format(value, name)


def _check_mode(value: Any, component: str) -> str | None:
  if value is None:
    return None
  return validation.check_scale(value, f'scale_mode[{component!r}]')


@dataclasses.dataclass(frozen=True)
class QuantizedTraining:
  """Formats of the four components; made by :func:`quantized_training`.

  Attributes:
    formats: ``{component: Format or None}`` for ``'g'``, ``'w'``, ``'m'``
      and ``'v'`` (None: float32).
    rounding: ``'nearest'`` or ``'stochastic'``, for every component.
    seed: Seed of the stochastic rounding.
    scale_mode: ``{component: scale mode or None}`` (None: the default of
      the component's format).
    block_size: Elements per scale for block scales.
    min_size: Moment leaves with fewer elements stay float32.
  """

  formats: Mapping[str, formats_lib.Format | None]
  rounding: str = 'stochastic'
  seed: int = 0
  scale_mode: Mapping[str, str | None] = dataclasses.field(
      default_factory=dict)
  block_size: int = 128
  min_size: int = 0

  def gradients(self) -> optax.GradientTransformation:
    """The ``q_G`` transform (the identity when ``'g'`` is float32)."""
    fmt = self.formats['g']
    if fmt is None:
      return optax.identity()
    return gradients.quantize_gradients(
        fmt, rounding=self.rounding, scale_mode=self.scale_mode.get('g'),
        block_size=self.block_size, seed=self.seed)

  def optimizer(self, tx: optax.GradientTransformation, *,
                elementwise: bool = False) -> optax.GradientTransformation:
    """``tx`` with quantized gradients in front and quantized moments.

    Args:
      tx: An Optax optimizer with float32 state (``optax.adam``,
        ``optax.adamw``, ``optax.contrib.muon``, ``optax.sgd`` with
        momentum, ...). ``'m'`` applies to its ``mu`` (or ``trace``)
        fields, ``'v'`` to its ``nu`` fields: in Muon, the momentum and the
        auxiliary Adam's moments.
      elementwise: As for :func:`quantize_state` (True for Adam-like
        optimizers, where it is faster; not for Muon).

    Returns:
      ``optax.chain(gradients(), quantize_state(tx, ...))``.

    Raises:
      ValueError: when a moment's format is set and ``tx``'s state has no
        such field.
    """
    tx = validation.check_transform(tx, 'tx')
    fields = self._moment_formats(tx)
    if fields:
      modes = {f: self.scale_mode.get(c) for c in ('m', 'v')
               for f in MOMENT_FIELDS[c] if f in fields
               and self.scale_mode.get(c) is not None}
      tx = transform.quantize_state(
          tx, fields, rounding=self.rounding, seed=self.seed,
          min_size=self.min_size, block_size=self.block_size,
          scale_mode=modes or None, track_stalls=False,
          elementwise=elementwise)
    return optax.chain(self.gradients(), tx)

  def _moment_formats(self, tx) -> dict[str, formats_lib.Format]:
    wanted = {c: self.formats[c] for c in ('m', 'v')
              if self.formats[c] is not None}
    if not wanted:
      return {}
    names = state_tree.probe_field_names(tx)
    known = None if names is None else names[0]
    out = {}
    for component, fmt in wanted.items():
      present = [f for f in MOMENT_FIELDS[component]
                 if known is None or f in known]
      if not present:
        raise ValueError(
            f'formats[{component!r}]={fmt.name!r}, but the optimizer state '
            f'has no field {" or ".join(MOMENT_FIELDS[component])} (its '
            f'float fields: {sorted(known)}).')
      out.update({f: fmt for f in present})
    return out

  def weights(self, params: Any, step: int | jax.Array = 0) -> Any:
    """The ``q_W`` forward weights: every float leaf of rank >= 1 rounded
    to ``formats['w']`` with a straight-through gradient to the float32
    master (:func:`fake_quantize_params`); ``params`` when ``'w'`` is
    float32. Pass the step so stochastic rounding draws new bits."""
    fmt = self.formats['w']
    if fmt is None:
      return params
    return weights.fake_quantize_params(
        params, fmt, scale_mode=self.scale_mode.get('w'),
        block_size=self.block_size, filter='all', rounding=self.rounding,
        seed=self.seed, step=step)


def quantized_training(
    formats: Formats,
    *,
    rounding: str = 'stochastic',
    seed: int = 0,
    scale_mode: str | Mapping[str, str | None] | None = None,
    block_size: int = 128,
    min_size: int = 0,
) -> QuantizedTraining:
  """Sets the formats of gradients, weights and moments independently.

  The framework of Tang et al. (2025): a master keeps float32 weights
  ``W``; the forward and backward passes run on ``q_W(W)``; the gradient is
  quantized (``q_G``); the optimizer reads its moments from storage in
  ``q_M`` and ``q_V``, updates them in float32 and stores them again; the
  step is applied to ``W``. Use::

    q = optax_q.quantized_training({'g': 'e5m2', 'w': 'e4m3',
                                    'm': 'e4m3', 'v': 'e8m7'})
    tx = q.optimizer(optax.adam(1e-3))
    loss = lambda params, step: loss_fn(q.weights(params, step), batch)

  Args:
    formats: One format for all four components, or a dict with keys among
      ``'g'`` (gradients), ``'w'`` (forward weights), ``'m'`` (first
      moment) and ``'v'`` (second moment); a missing key or None keeps
      that component in float32. Any core format (``'e{E}m{M}'`` floats,
      ``'e4m3'``, ``'int8'``, ...); ``'v'`` may be unsigned.
    rounding: ``'stochastic'`` (the paper's simulation) or ``'nearest'``.
    seed: Seed of the stochastic rounding, an int in ``[0, 2**32 - 1]``.
    scale_mode: One scale mode for every component or a dict per
      component; None: each format's default (block scales for formats
      narrower than float32's range, row scales for weights, none for
      ``e8m*``), which keeps values in the normal range as the analysis
      assumes.
    block_size: Elements per scale for block scales.
    min_size: Moment leaves with fewer elements stay float32; 0 (the
      default) quantizes every moment, as the analysis does.

  Returns:
    A :class:`QuantizedTraining` with ``optimizer(tx)``, ``gradients()``
    and ``weights(params, step)``.

  Raises:
    ValueError: at construction, for an unknown component (naming the
      allowed ones), a bad format (naming the component), an unsigned
      format for ``'g'``, ``'w'`` or ``'m'``, or a bad scale mode,
      rounding, seed, block size or ``min_size``.

  Examples:
    >>> import jax.numpy as jnp, optax, optax_q
    >>> q = optax_q.quantized_training({'g': 'e4m3', 'v': 'e5m2'})
    >>> tx = q.optimizer(optax.adam(1e-3))
    >>> params = {'w': jnp.ones((4, 4))}
    >>> updates, state = tx.update(params, tx.init(params))
    >>> sorted(c for c, f in q.formats.items() if f is not None)
    ['g', 'v']

  References:
    Tang et al, `A Convergence Analysis of Adaptive Optimizers under
    Floating-point Quantization <https://arxiv.org/abs/2510.21314>`_, 2025
  """
  if formats is None:
    formats = {}
  checked = _check_components(formats, 'formats', _check_format)
  modes = _check_components(scale_mode, 'scale_mode', _check_mode)
  for component, fmt in checked.items():
    if fmt is not None and modes[component] is not None:
      qarray_lib.check_layout(fmt, modes[component],
                              f'scale_mode[{component!r}]')
  result = QuantizedTraining(
      formats=checked,
      rounding=validation.check_rounding(rounding),
      seed=validation.check_seed(seed),
      scale_mode=modes,
      block_size=validation.check_block_size(block_size),
      min_size=validation.check_int(min_size, 'min_size'))
  result.gradients()  # Checks the gradients' layout now.
  return result

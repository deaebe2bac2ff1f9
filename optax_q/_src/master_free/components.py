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
`quantized_training` holds the four formats and builds the pieces
from the library's own parts: `quantize_gradients` first in the
chain, `quantize_state` around the optimizer, and
`fake_quantize_params` for the forward weights.
"""

from __future__ import annotations

from collections.abc import Mapping
import dataclasses
import types
from typing import Any

import jax
import optax

from optax_q._src.codec import formats as formats_lib
from optax_q._src.codec import qarray as qarray_lib
from optax_q._src.core import validation
from optax_q._src.master_free import gradients
from optax_q._src.master_free import weights
from optax_q._src.state import state_tree
from optax_q._src.state import transform

# The components, in the paper's order of notation: gradients, weights,
# first moment, second moment.
COMPONENTS = ('g', 'w', 'm', 'v')
# State fields that hold each moment (Adam, Muon and Lion: mu; SGD with
# momentum: trace; Adam: nu, AMSGrad's nu_max too).
MOMENT_FIELDS = types.MappingProxyType(
    {'m': ('mu', 'trace'), 'v': ('nu', 'nu_max')})
Formats = str | formats_lib.Format | Mapping[str, Any] | None


def _per_component(value: Any, name: str) -> dict[str, Any]:
  """``{component: value}`` from one value for all or a mapping."""
  if not isinstance(value, Mapping):
    return dict.fromkeys(COMPONENTS, value)
  unknown = sorted(str(k) for k in value if k not in COMPONENTS)
  if unknown:
    raise ValueError(
        f'{name} has unknown components {unknown}; the components are '
        f"{COMPONENTS} ('g' gradients, 'w' weights, 'm' first moment, "
        "'v' second moment).")
  return {c: value.get(c) for c in COMPONENTS}


def _check_format(value: Any, component: str) -> formats_lib.Format | None:
  if value is None:
    return None
  name = f'formats[{component!r}]'
  if component == 'v':
    return formats_lib.check_second_moment_format(value, name)
  return formats_lib.check_signed_format(value, name)


def _check_mode(mode: Any, component: str, fmt) -> str | None:
  if mode is None:
    return None
  name = f'scale_mode[{component!r}]'
  if fmt is None:
    raise ValueError(
        f'{name}={validation.short(mode)} is given, but formats has no '
        f'{component!r}: that component stays float32.')
  mode = validation.check_scale(mode, name)
  if mode == 'rank1' and component in ('g', 'w'):
    raise ValueError(
        f"{name}='rank1' is a second-moment layout; {component!r} takes "
        "'none', 'tensor', 'row', 'block' or 'block_pow2'.")
  qarray_lib.check_layout(fmt, mode, name)
  return mode


@dataclasses.dataclass(frozen=True, eq=False)
class QuantizedTraining:
  """Formats of the four components, checked when made.

  Made by [`quantized_training`][optax_q.quantized_training] (or directly, with
  the same checks).

  Attributes:
    formats: ``{component: Format or None}`` for ``'g'``, ``'w'``, ``'m'``
      and ``'v'`` (None: float32); given as one format for all or a
      mapping (``{}``: all float32).
    rounding: ``'nearest'`` or ``'stochastic'``, for every component.
    seed: Seed of the stochastic rounding.
    scale_mode: ``{component: scale mode or None}`` (None: the default of
      the component's format).
    block_size: Elements per scale for block scales.
    min_size: Moment leaves with fewer elements stay float32.
    required: The moment components an optimizer must have: those named
      in a mapping of ``formats``; one format for all applies to the
      moments the optimizer has.
  """

  formats: Formats
  rounding: str = 'stochastic'
  seed: int = 0
  scale_mode: str | Mapping[str, str | None] | None = None
  block_size: int = 128
  min_size: int = 0
  required: frozenset[str] = dataclasses.field(init=False)

  def __post_init__(self):
    raw = self.formats
    if raw is None:
      raise ValueError(
          'formats=None quantizes nothing: give one format for all '
          "components (e.g. 'e4m3') or a dict with keys among "
          f"{COMPONENTS} ('g' gradients, 'w' weights, 'm' first moment, "
          "'v' second moment); {} keeps every component in float32.")
    given = _per_component(raw, 'formats')
    fmts = {c: _check_format(v, c) for c, v in given.items()}
    modes = _per_component(self.scale_mode, 'scale_mode')
    if not isinstance(self.scale_mode, Mapping):  # One mode for the given.
      modes = {c: m if fmts[c] is not None else None
               for c, m in modes.items()}
    modes = {c: _check_mode(m, c, fmts[c]) for c, m in modes.items()}
    required = frozenset(c for c in ('m', 'v') if isinstance(raw, Mapping)
                         and fmts[c] is not None)
    checked = dict(
        formats=types.MappingProxyType(fmts),
        scale_mode=types.MappingProxyType(modes),
        rounding=validation.check_rounding(self.rounding),
        seed=validation.check_seed(self.seed),
        block_size=validation.check_block_size(self.block_size),
        min_size=validation.check_int(self.min_size, 'min_size'),
        required=required)
    for name, value in checked.items():
      object.__setattr__(self, name, value)

  def gradients(self) -> optax.GradientTransformationExtraArgs:
    """The ``q_G`` transform (the identity when ``'g'`` is float32)."""
    fmt = self.formats['g']
    if fmt is None:
      return optax.with_extra_args_support(optax.identity())
    return gradients.quantize_gradients(
        fmt, rounding=self.rounding, scale_mode=self.scale_mode['g'],
        block_size=self.block_size, seed=self.seed)

  def optimizer(self, tx: optax.GradientTransformation, *,
                elementwise: bool = False
                ) -> optax.GradientTransformationExtraArgs:
    """``tx`` with quantized gradients in front and quantized moments.

    Args:
      tx: An Optax optimizer with float32 state (``optax.adam``,
        ``optax.adamw``, ``optax.contrib.muon``, ``optax.sgd`` with
        momentum, ...). ``'m'`` applies to its ``mu`` (or ``trace``)
        fields, ``'v'`` to its ``nu`` (and ``nu_max``) fields: in Muon, the
        momentum and the auxiliary Adam's moments.
      elementwise: As for [`quantize_state`][optax_q.quantize_state] (True for
        Adam-like optimizers, where it is faster; not for Muon).

    Returns:
      ``optax.chain(gradients(), quantize_state(tx, ...))``.

    Raises:
      ValueError: here, or at ``init`` on the real parameters, when a
        moment named in a mapping of ``formats`` has no field in ``tx``'s
        state.
    """
    tx = validation.check_transform(tx, 'tx')
    fields = self._moment_formats(tx)
    if fields:
      modes = {f: self.scale_mode[c] for c in ('m', 'v')
               for f in MOMENT_FIELDS[c] if f in fields
               and self.scale_mode[c] is not None}
      tx = _checked_init(transform.quantize_state(
          tx, fields, rounding=self.rounding, seed=self.seed,
          min_size=self.min_size, block_size=self.block_size,
          scale_mode=modes or None, track_stalls=False,
          elementwise=elementwise), self._missing)
    return optax.chain(self.gradients(), tx)

  def _missing(self, names: set[str]) -> None:
    """Raises for a required moment none of whose fields is in ``names``."""
    for c in sorted(self.required):
      if not set(MOMENT_FIELDS[c]) & names:
        raise ValueError(
            f'formats[{c!r}]={self.formats[c].name!r}, but the state of tx '
            f'(the optimizer) has no field {" or ".join(MOMENT_FIELDS[c])} '
            f'(its float fields: {sorted(names)}).')

  def _moment_formats(self, tx) -> dict[str, formats_lib.Format]:
    wanted = [c for c in ('m', 'v') if self.formats[c] is not None]
    if not wanted:
      return {}
    names = state_tree.probe_field_names(tx)
    known = None if names is None else names[0]
    if known is not None:
      self._missing(known)
    return {f: self.formats[c] for c in wanted for f in MOMENT_FIELDS[c]
            if known is None or f in known}

  def weights(self, params: Any, step: int | jax.Array | None = None) -> Any:
    """The ``q_W`` forward weights: every float leaf of rank >= 1 rounded
    to ``formats['w']`` with a straight-through gradient to the float32
    master ([`fake_quantize_params`][optax_q.fake_quantize_params]); ``params``
    when ``'w'`` is float32. With stochastic rounding, pass the step (a traced
    integer is fine), so that every step draws new bits."""
    fmt = self.formats['w']
    if fmt is None:
      return params
    if step is None:
      if self.rounding == 'stochastic':
        raise ValueError(
            "weights(params, step): stochastic rounding needs the step, so "
            'that every step draws new bits.')
      step = 0
    return weights.fake_quantize_params(
        params, fmt, scale_mode=self.scale_mode['w'],
        block_size=self.block_size, filter='all', rounding=self.rounding,
        seed=self.seed, step=step)


def _checked_init(tx, check) -> optax.GradientTransformationExtraArgs:
  """``tx`` whose ``init`` checks the fields of the real state."""
  def init_fn(params):
    state = tx.init(params)
    check(state_tree.field_names(state.inner_state)[0])
    return state
  return optax.GradientTransformationExtraArgs(init_fn, tx.update)


def quantized_training(
    formats: Formats,
    *,
    rounding: str = 'stochastic',
    seed: int = 0,
    scale_mode: str | Mapping[str, str | None] | None = None,
    block_size: int = 128,
    min_size: int = 0,
) -> QuantizedTraining:
  r"""Sets the formats of gradients, weights and moments independently.

  The framework of Tang et al. (2025): a master keeps float32 weights
  ``W``; the forward and backward passes run on ``q_W(W)``; the gradient is
  quantized (``q_G``); the optimizer reads its moments from storage in
  ``q_M`` and ``q_V``, updates them in float32 and stores them again; the
  step is applied to ``W``. For a loss `f`, one step is

  ```tex
  \bar W_t = q_W(W_{t-1}), \qquad
  \tilde g_t = q_G\big(\nabla f(\bar W_t)\big),
  \\
  (u_t, m_t, v_t) = \mathrm{opt}\big(\tilde g_t,
    D(\hat m_{t-1}), D(\hat v_{t-1})\big), \qquad
  \hat m_t = Q_M(m_t), \quad \hat v_t = Q_V(v_t),
  \\
  W_t = W_{t-1} + u_t,
  ```

  where `q_W = D \circ Q` in ``formats['w']`` with a straight-through
  gradient (`\partial f / \partial W = \nabla f(\bar W_t)`;
  [`fake_quantize_params`][optax_q.fake_quantize_params] on every float leaf
  of rank >= 1), `q_G = D \circ Q` in ``formats['g']``
  ([`quantize_gradients`][optax_q.quantize_gradients]), and `Q_M`, `Q_V`
  encode the optimizer's first and second moments (its ``mu`` or ``trace``,
  and ``nu`` or ``nu_max`` fields) in ``formats['m']`` and ``formats['v']``
  ([`quantize_state`][optax_q.quantize_state]); the optimizer ``opt`` runs
  in float32 and its update comes from the float32 `m_t, v_t`. A component
  without a format is the identity. Use:

  ```python
  q = optax_q.quantized_training({'g': 'e5m2', 'w': 'e4m3',
                                  'm': 'e4m3', 'v': 'e8m7'})
  tx = q.optimizer(optax.adam(1e-3))
  loss = lambda params, step: loss_fn(q.weights(params, step), batch)
  ```

  Args:
    formats: One format for all four components, or a dict with keys among
      ``'g'`` (gradients), ``'w'`` (forward weights), ``'m'`` (first
      moment) and ``'v'`` (second moment); a missing key or None keeps
      that component in float32 (``{}`` keeps them all: a baseline). Any
      core format (``'e{E}m{M}'`` floats, ``'e4m3'``, ``'int8'``, ...);
      ``'v'`` may be unsigned (not the first-moment grids ``'nf4'`` and
      ``'nf3'``).
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
    A [`QuantizedTraining`][optax_q.QuantizedTraining] with ``optimizer(tx)``,
    ``gradients()`` and ``weights(params, step)``.

  Raises:
    ValueError: at construction, for ``formats=None``, an unknown component
      (naming the allowed ones), a bad format (naming the component), an
      unsigned format for ``'g'``, ``'w'`` or ``'m'``, or a bad scale mode,
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
    Tang et al, [A Convergence Analysis of Adaptive Optimizers under
    Floating-point Quantization](https://arxiv.org/abs/2510.21314), 2025
  """
  return QuantizedTraining(
      formats=formats, rounding=rounding, seed=seed, scale_mode=scale_mode,
      block_size=block_size, min_size=min_size)

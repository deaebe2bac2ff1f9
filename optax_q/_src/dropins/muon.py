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
"""Muon with its momentum (and its auxiliary Adam's moments) in low bits.

``optax.contrib.muon`` orthogonalizes the momentum of matrix parameters
(Newton-Schulz) and trains the others with an auxiliary AdamW, as a
partition of two transforms. `muon` wraps it whole in
`quantize_state` and gives each part its own formats: the state
leaves under the partition's ``'muon'`` label take ``mu_format``, those
under ``'adam'`` take ``adam_mu_format`` and ``adam_nu_format``.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import optax

from optax_q._src.codec import formats as formats_lib
from optax_q._src.codec import qarray as qarray_lib
from optax_q._src.core import explicit
from optax_q._src.core import validation
from optax_q._src.state import state_tree
from optax_q._src.state import transform

# 8-bit Muon (Gupta et al., 2025): linear int8 momentum with blocks of 2048.
DEFAULT_BLOCK_SIZE = 2048


def _part_and_field(path: str) -> tuple[str | None, str | None]:
  """``('muon' | 'adam', field)`` of a state leaf of the partition, whose
  paths read ``inner_states/<label>/inner_state/<i>/<field>/<param>``."""
  parts = path.split('/')
  if len(parts) < 5 or parts[0] != 'inner_states':
    return None, None
  return parts[1], parts[4]


def _check_layout_known(tx, formats) -> None:
  """Raises if the partition's state does not read as `_part_and_field`
  expects (an Optax version with another layout)."""
  probe = {'w': jax.ShapeDtypeStruct((8, 8), jnp.float32),
           'b': jax.ShapeDtypeStruct((8,), jnp.float32)}
  state = jax.eval_shape(tx.init, probe)
  seen = set()
  for path, _ in jax.tree_util.tree_flatten_with_path(state)[0]:
    part, field = _part_and_field(state_tree.path_str(path))
    seen.add((part, field))
  missing = sorted(k for k in formats if k not in seen)
  if missing:
    raise RuntimeError(
        f'optax.contrib.muon state has no leaves at {missing} (found '
        f'{sorted(s for s in seen if s[0])}): this Optax version lays out '
        "Muon's state differently; use optax_q.quantize_state directly.")


def muon(
    learning_rate: optax.ScalarOrSchedule,
    ns_coeffs: Any = (3.4445, -4.775, 2.0315),
    ns_steps: int = 5,
    beta: jax.typing.ArrayLike = 0.95,
    eps: jax.typing.ArrayLike = 1e-8,
    weight_decay: jax.typing.ArrayLike = 0.0,
    weight_decay_mask: Any = None,
    *,
    mu_format: str | formats_lib.Format = 'int8',
    adam_mu_format: str | formats_lib.Format = 'int8_dynamic',
    adam_nu_format: str | formats_lib.Format = 'int8_dynamic',
    rounding: str = 'stochastic',
    block_size: int | None = None,
    seed: int | None = None,
    min_size: int | None = None,
    scale_mode: str | None = None,
    track_stalls: bool = False,
    nesterov: bool = True,
    adam_b1: jax.typing.ArrayLike = 0.9,
    adam_b2: jax.typing.ArrayLike = 0.999,
    adam_weight_decay: jax.typing.ArrayLike = 0.0,
    adam_learning_rate: optax.ScalarOrSchedule | None = None,
    muon_weight_dimension_numbers: Any = None,
    **muon_options: Any,
) -> optax.GradientTransformation:
  r"""Muon with its state stored in low precision (8-bit Muon by default).

  ``quantize_state(optax.contrib.muon(...))`` with a format per part: the
  Muon momentum of matrix parameters in ``mu_format`` (linear ``int8``
  with blocks of 2048 by default: the configuration that matched float32
  Muon up to 2.7B parameters, Gupta et al., 2025), and the auxiliary AdamW
  of the other parameters in ``adam_mu_format`` and ``adam_nu_format``
  (the bitsandbytes dynamic map by default). Arithmetic is float32: the
  momentum is decoded, updated and orthogonalized, then stored again. With
  ``'fp32'`` formats this is ``optax.contrib.muon``, bit for bit; its
  positional arguments come in Optax's order.

  A leaf that Muon trains is read as an `m \times n` matrix (rows: its
  reduction axes, columns: its output axes; any other axes index a batch
  of such matrices). With its gradient `G_t`, the step count `t` and the
  momentum stored as `\hat\mu_{t-1}`, a step computes (with Optax's
  defaults for ``muon_options``: Frobenius preconditioning, width
  scaling, not adaptive):

  ```tex
  \mu_t = \beta\, D(\hat\mu_{t-1}) + (1 - \beta)\, G_t, \qquad
  \hat\mu_t = Q(\mu_t),
  \\
  M_t = \frac{\beta\, \mu_t}{1 - \beta^{t+1}}
      + \frac{(1 - \beta)\, G_t}{1 - \beta^t}
  \quad \Big(\text{without Nesterov: }
  M_t = \frac{\mu_t}{1 - \beta^t}\Big),
  \\
  X_0 = \frac{M_t}{\|M_t\|_F + \epsilon}, \qquad
  X_{k+1} = a X_k + \big(b A_k + c A_k^2\big) X_k, \quad
  A_k = X_k X_k^\top,
  \\
  u_t = -\eta_t \Big(\sqrt{\max(1, n / m)}\; X_K + \lambda W\Big),
  ```

  with `(a, b, c)` = ``ns_coeffs``, `K` = ``ns_steps`` (the iteration
  runs on `X^\top` when `m > n`, so that `A_k` is the smaller Gram
  matrix), `\eta_t` the learning rate, `W` the parameter and `\lambda` =
  ``weight_decay`` (0 where ``weight_decay_mask`` excludes it). `X_K` is
  close to the orthogonal factor `U V^\top` of `M_t = U \Sigma V^\top`:
  its singular values land near 1, not at 1. The other leaves take AdamW,
  its first moment in the same form (Nesterov's when ``nesterov``, else
  `\tilde m_t = m_t / (1 - \beta_1^t)`):

  ```tex
  m_t = \beta_1 D(\hat m_{t-1}) + (1 - \beta_1)\, g_t, \qquad
  v_t = \beta_2 D(\hat v_{t-1}) + (1 - \beta_2)\, g_t^2,
  \\
  \tilde m_t = \frac{\beta_1 m_t}{1 - \beta_1^{t+1}}
      + \frac{(1 - \beta_1)\, g_t}{1 - \beta_1^t}, \qquad
  u_t = -\eta'_t \Big(\frac{\tilde m_t}
      {\sqrt{v_t / (1 - \beta_2^t)} + \epsilon} + \lambda' w\Big),
  \\
  \hat m_t = Q(m_t), \qquad \hat v_t = Q(v_t),
  ```

  with `\beta_1, \beta_2` = ``adam_b1``, ``adam_b2``, `\eta'_t` =
  ``adam_learning_rate`` and `\lambda'` = ``adam_weight_decay``. As in
  [`quantize_state`][optax_q.quantize_state], `Q` encodes a leaf in its
  part's format with ``rounding`` (by default one scale per block of
  ``block_size`` elements along the last axis) and `D` decodes it to
  float32; the update comes from the float32 `\mu_t` (or `m_t, v_t`), and
  leaves below ``min_size`` elements are kept as they are (`Q` is then the
  identity).

  Args:
    learning_rate: A float or an Optax schedule.
    ns_coeffs: Newton-Schulz coefficients, as in ``optax.contrib.muon``.
    ns_steps: Newton-Schulz iterations, as in ``optax.contrib.muon``.
    beta: Momentum decay, in [0, 1).
    eps: As in ``optax.contrib.muon``, >= 0.
    weight_decay: Decoupled weight decay of the Muon parameters, >= 0.
    weight_decay_mask: As in ``optax.contrib.muon``.
    mu_format: Format of the Muon momentum (see
      [`get_format`][optax_q.get_format]); signed. ``'int4'`` (with
      ``block_size=128``) for 4-bit momentum.
    adam_mu_format: Format of the auxiliary Adam's first moment; signed.
    adam_nu_format: Format of its second moment (unsigned variants).
    rounding: ``'stochastic'`` or ``'nearest'``.
    block_size: Elements per scale along the last axis; None: 2048.
    seed: Seed of the stochastic rounding; None: 0.
    min_size: Leaves with fewer elements keep float32 state; None: 4096.
    scale_mode: None (the formats' default) or a scale mode for every
      quantized leaf (see [`quantize_state`][optax_q.quantize_state]).
    track_stalls: Record the stalled fraction of each quantized leaf.
    nesterov: Nesterov momentum, as in ``optax.contrib.muon``.
    adam_b1: The auxiliary Adam's first-moment decay, in [0, 1).
    adam_b2: Its second-moment decay, in [0, 1).
    adam_weight_decay: Its decoupled weight decay, >= 0.
    adam_learning_rate: Its learning rate; None: ``learning_rate``.
    muon_weight_dimension_numbers: Which parameters Muon trains and along
      which axes, as in ``optax.contrib.muon`` (None: every 2-D leaf): a
      ``MuonDimensionNumbers``, a tree of them (None for the leaves the
      auxiliary Adam trains) that prefixes the parameters, or a callable
      ``params -> tree``. Checked at construction, and against the
      parameters at ``init`` (each axis in range, reduction and output axes
      disjoint, every leaf trained by Muon of rank >= 2).
    **muon_options: Further keyword arguments of ``optax.contrib.muon``
      (``adaptive``, ``consistent_rms``, ...). (``optax.inject_hyperparams``
      passes them back as one ``muon_options={...}`` keyword: accepted.)

  Returns:
    An Optax gradient transformation.

  Raises:
    ValueError: at construction, naming the bad argument and the allowed
      values (at ``init`` for dimension numbers that do not fit the
      parameters). Under ``optax.inject_hyperparams`` numbers arrive as
      arrays: concrete ones are checked, traced ones accepted.

  Examples:
    >>> import jax.numpy as jnp, optax_q
    >>> tx = optax_q.muon(0.02, min_size=0)
    >>> state = tx.init({'w': jnp.zeros((64, 4096)), 'b': jnp.zeros(64)})
    >>> round(optax_q.state_bits_per_element(state), 3)
    8.016

  References:
    Jordan et al, [Muon: An optimizer for hidden layers in neural
    networks](https://kellerjordan.github.io/posts/muon/), 2024

    Gupta et al, [Effective Quantization of Muon Optimizer
    States](https://arxiv.org/abs/2509.23106), 2025
  """
  validation.check_number(learning_rate, 'learning_rate', schedule=True)
  for name, value in dict(beta=beta, adam_b1=adam_b1,
                          adam_b2=adam_b2).items():
    validation.check_number(value, name, high=1.0)  # Decays: in [0, 1).
  for name, value in dict(eps=eps, weight_decay=weight_decay,
                          adam_weight_decay=adam_weight_decay).items():
    validation.check_number(value, name)
  if adam_learning_rate is not None:
    validation.check_number(adam_learning_rate, 'adam_learning_rate',
                            schedule=True)
  # An int, or an integer array as optax.inject_hyperparams passes it.
  ns_steps = validation.check_int(ns_steps, 'ns_steps', low=1, traced=True)
  # optax.inject_hyperparams binds the catch-all by name: it passes the
  # options back as one muon_options={...} keyword, unpacked here.
  muon_options = dict(muon_options)
  nested = muon_options.pop('muon_options', {})
  if not isinstance(nested, dict):
    raise ValueError(
        'muon_options must be a dict of keyword arguments of '
        f'optax.contrib.muon, got {validation.short(nested)}.')
  twice = sorted(set(nested) & set(muon_options))
  if twice:
    raise ValueError(f'muon options {twice} are given twice.')
  muon_options = {**nested, **muon_options}
  dimension_numbers = _checked_dimension_numbers(
      muon_weight_dimension_numbers)
  formats = {
      ('muon', 'mu'): formats_lib.check_signed_format(mu_format, 'mu_format'),
      ('adam', 'mu'): formats_lib.check_signed_format(
          adam_mu_format, 'adam_mu_format'),
      ('adam', 'nu'): formats_lib.check_format(adam_nu_format,
                                               'adam_nu_format'),
  }
  make = functools.partial(
      optax.contrib.muon, learning_rate, ns_coeffs=ns_coeffs,
      ns_steps=ns_steps, beta=beta, eps=eps, weight_decay=weight_decay,
      nesterov=validation.check_bool(nesterov, 'nesterov'), adam_b1=adam_b1,
      adam_b2=adam_b2, adam_weight_decay=adam_weight_decay,
      adam_learning_rate=adam_learning_rate, **muon_options)
  # The layout is checked on a probe tree, with the default parameter
  # labels (the caller's dimension numbers and mask fit their own tree).
  _check_layout_known(make(), formats)
  tx = _gathered_for_newton_schulz(make(weight_decay_mask=weight_decay_mask,
      muon_weight_dimension_numbers=dimension_numbers))
  if scale_mode is not None:
    scale_mode = validation.check_scale(scale_mode)
    for fmt in formats.values():
      qarray_lib.check_layout(fmt, scale_mode)

  def choose(path: str, leaf: Any) -> formats_lib.Format | None:
    del leaf
    return formats.get(_part_and_field(path))

  return transform.quantize_state(
      tx, choose, rounding=rounding, seed=seed, min_size=min_size,
      block_size=DEFAULT_BLOCK_SIZE if block_size is None else block_size,
      scale_mode=scale_mode, track_stalls=track_stalls)


_DIMS_WHAT = (
    'muon_weight_dimension_numbers must be None, an '
    'optax.contrib.MuonDimensionNumbers, a tree of them (None for the '
    'leaves the auxiliary Adam trains) or a callable params -> such a tree')


def _is_dims(x: Any) -> bool:
  return x is None or isinstance(x, optax.contrib.MuonDimensionNumbers)


def _axes(axes: Any, name: str) -> tuple[int, ...]:
  """One side of a ``MuonDimensionNumbers``: an int or ints, as a tuple."""
  out = (axes,) if validation.is_int(axes) else axes
  if (isinstance(out, str) or not isinstance(out, (tuple, list))
      or not out or not all(validation.is_int(a) for a in out)
      or len(set(out)) != len(out)):
    raise ValueError(
        f'{name} must be an int or a non-empty sequence of distinct ints '
        f'(axes of the parameter), got {validation.short(axes)}.')
  return tuple(int(a) for a in out)


def _check_dims_tree(dims: Any, where: str) -> list[tuple[str, Any]]:
  """``(path, MuonDimensionNumbers | None)`` of a tree of dimension numbers,
  each checked on its own (axes ints, no axis on both sides)."""
  flat = jax.tree_util.tree_flatten_with_path(dims, is_leaf=_is_dims)[0]
  for path, d in flat:
    at = f'{where}{jax.tree_util.keystr(path)}'
    if not _is_dims(d):
      raise ValueError(f'{_DIMS_WHAT}; {at} is {validation.short(d)}.')
    if d is None:
      continue
    both = set(_axes(d.reduction_axis, f'{at}.reduction_axis')) & set(
        _axes(d.output_axis, f'{at}.output_axis'))
    if both:
      raise ValueError(
          f'{at} names axes {sorted(both)} as both reduction and output '
          'axes; they must be disjoint.')
  return flat


def _checked_dimension_numbers(dims: Any) -> Any:
  """``dims`` checked as far as it can be without the parameters, and
  wrapped so that ``optax.contrib.muon`` checks it against them at
  ``init`` (its labels are computed there) rather than at the update:
  every parameter it gives to Muon must have the axes it names (rank >= 2,
  in range, disjoint once made non-negative)."""
  where = 'muon_weight_dimension_numbers'
  if dims is None:
    return None
  if not callable(dims):
    _check_dims_tree(dims, where)

  def resolve(params):
    tree = dims(params) if callable(dims) else dims
    at = where if tree is dims else f'{where}(params)'
    flat = _check_dims_tree(tree, at)
    try:
      subtrees = jax.tree.structure(tree, is_leaf=_is_dims).flatten_up_to(
          params)
    except (ValueError, TypeError) as e:
      raise ValueError(
          f'{at} must have the structure of the parameters (or a prefix '
          f'of it): {e}') from None
    for (path, d), sub in zip(flat, subtrees):
      if d is None:
        continue
      for leaf_path, x in jax.tree_util.tree_flatten_with_path(sub)[0]:
        name = jax.tree_util.keystr(path + leaf_path)
        ndim = len(x.shape)
        axes = {side: _axes(getattr(d, side), side)
                for side in ('reduction_axis', 'output_axis')}
        bad = [a for ax in axes.values() for a in ax
               if not -ndim <= a < ndim]
        if ndim < 2 or bad:
          raise ValueError(
              f'{at} gives Muon the parameter {name} of shape '
              f'{tuple(x.shape)} with {d}: '
              + ('Muon trains only leaves of rank >= 2 (give it None to '
                 'train it with the auxiliary Adam).' if ndim < 2 else
                 f'axes {bad} are out of range for rank {ndim}.'))
        red, out = ({a % ndim for a in ax} for ax in axes.values())
        if red & out:
          raise ValueError(
              f'{at} gives the parameter {name} of rank {ndim} the axes '
              f'{sorted(red & out)} as both reduction and output axes ({d}).')
    return tree

  return resolve


def _gathered_for_newton_schulz(
    tx: optax.GradientTransformation) -> optax.GradientTransformation:
  """``tx`` (the partition) with Muon's matrices gathered whole on a mesh
  with Explicit axes.

  Newton-Schulz multiplies the momentum ``X`` by itself, ``X X^T`` and
  ``(X X^T) X``: every product contracts an axis the parameter may be
  sharded over, and a row-sharded ``X X^T`` would be sharded twice over one
  mesh axis, so the types of a sharded ``X`` admit no product at all. The
  orthogonalization needs the whole matrix anyway (as the unsharded run
  computes it), so each Muon leaf (gradient, parameter and state) enters
  the update replicated, and the results leave sharded as their inputs
  came: the same arithmetic as the unsharded run. The auxiliary Adam's
  leaves stay as they are; on other meshes (Auto axes, one device) this is
  ``tx`` itself.
  """
  is_masked = lambda x: isinstance(x, optax.MaskedNode)

  def update_fn(updates, state, params=None):
    # Which leaves Muon trains: those its momentum is not masked at (the
    # layout `_check_layout_known` checks).
    muon_mu = state.inner_states['muon'].inner_state[0].mu

    def gather(tree):
      if tree is None:
        return None
      return jax.tree.map(
          lambda m, x: x if is_masked(m) else explicit.replicated(x),
          muon_mu, tree, is_leaf=is_masked)

    inner_states = dict(state.inner_states)
    inner_states['muon'] = jax.tree.map(explicit.replicated,
                                        inner_states['muon'])
    new_updates, new_state = tx.update(
        gather(updates), state._replace(inner_states=inner_states),
        gather(params))
    return (jax.tree.map(explicit.like, new_updates, updates),
            jax.tree.map(explicit.like, new_state, state))

  return optax.GradientTransformation(tx.init, update_fn)

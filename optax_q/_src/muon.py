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

from optax_q._src import explicit
from optax_q._src import formats as formats_lib
from optax_q._src import qarray as qarray_lib
from optax_q._src import state_tree
from optax_q._src import transform
from optax_q._src import validation

# 8-bit Muon (Gupta et al., 2025): linear int8 momentum with blocks of 2048.
DEFAULT_BLOCK_SIZE = 2048


def _part_and_field(path: str) -> tuple[str | None, str | None]:
  """``('muon' | 'adam', field)`` of a state leaf of the partition, whose
  paths read ``inner_states/<label>/inner_state/<i>/<field>/<param>``."""
  parts = path.split('/')
  if len(parts) < 5 or parts[0] != 'inner_states':
    return None, None
  return parts[1], parts[4]


def _chooser(formats: dict[tuple[str, str], formats_lib.Format | None]):
  def choose(path: str, leaf: Any) -> formats_lib.Format | None:
    del leaf
    return formats.get(_part_and_field(path))
  return choose


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
  """Muon with its state stored in low precision (8-bit Muon by default).

  ``quantize_state(optax.contrib.muon(...))`` with a format per part: the
  Muon momentum of matrix parameters in ``mu_format`` (linear ``int8``
  with blocks of 2048 by default: the configuration that matched float32
  Muon up to 2.7B parameters, Gupta et al., 2025), and the auxiliary AdamW
  of the other parameters in ``adam_mu_format`` and ``adam_nu_format``
  (the bitsandbytes dynamic map by default). Arithmetic is float32: the
  momentum is decoded, updated and orthogonalized, then stored again. With
  ``'fp32'`` formats this is ``optax.contrib.muon``, bit for bit; its
  positional arguments come in Optax's order.

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
      which axes, as in ``optax.contrib.muon`` (None: every 2-D leaf).
    **muon_options: Further keyword arguments of ``optax.contrib.muon``
      (``adaptive``, ``consistent_rms``, ...).

  Returns:
    An Optax gradient transformation.

  Raises:
    ValueError: at construction, naming the bad argument and the allowed
      values.

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
  _check_numbers(
      decays=dict(beta=beta, adam_b1=adam_b1, adam_b2=adam_b2),
      nonnegative=dict(eps=eps, weight_decay=weight_decay,
                       adam_weight_decay=adam_weight_decay),
      rates=dict(learning_rate=learning_rate,
                 adam_learning_rate=adam_learning_rate))
  ns_steps = validation.check_int(ns_steps, 'ns_steps', low=0)
  formats = {
      ('muon', 'mu'): formats_lib.check_signed_format(mu_format, 'mu_format'),
      ('adam', 'mu'): formats_lib.check_signed_format(
          adam_mu_format, 'adam_mu_format'),
      ('adam', 'nu'): formats_lib.check_format(adam_nu_format,
                                               'adam_nu_format'),
  }
  make = functools.partial(
      optax.contrib.muon, learning_rate, ns_coeffs=ns_coeffs,
      ns_steps=ns_steps, beta=beta,
      eps=eps, weight_decay=weight_decay,
      nesterov=validation.check_bool(nesterov, 'nesterov'), adam_b1=adam_b1,
      adam_b2=adam_b2, adam_weight_decay=adam_weight_decay,
      adam_learning_rate=adam_learning_rate, **muon_options)
  # The layout is checked on a probe tree, with the default parameter
  # labels (the caller's dimension numbers and mask fit their own tree).
  _check_layout_known(make(), formats)
  tx = _gathered_for_newton_schulz(make(
      weight_decay_mask=weight_decay_mask,
      muon_weight_dimension_numbers=muon_weight_dimension_numbers))
  if scale_mode is not None:
    scale_mode = validation.check_scale(scale_mode)
    for fmt in formats.values():
      qarray_lib.check_layout(fmt, scale_mode)
  return transform.quantize_state(
      tx, _chooser(formats), rounding=rounding, seed=seed,
      min_size=min_size,
      block_size=DEFAULT_BLOCK_SIZE if block_size is None else block_size,
      scale_mode=scale_mode, track_stalls=track_stalls)


def _check_numbers(*, decays, nonnegative, rates) -> None:
  """Decay rates in [0, 1); the others >= 0; learning rates >= 0 or
  schedules (None: unset)."""
  for name, value in decays.items():
    validation.check_number(value, name, high=1.0)
  for name, value in nonnegative.items():
    validation.check_number(value, name)
  for name, value in rates.items():
    if value is not None:
      validation.check_number(value, name, schedule=True)


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

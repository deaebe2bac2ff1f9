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
"""Quantized gradients: a transform placed first in a chain.

Every floating-point leaf of the incoming updates is rounded to a format
(any core format: ``e{E}m{M}`` floats, fp8, int8, ...), with its scales,
and decoded: the ``q_G`` of the floating-point convergence analysis
(Tang et al., 2025), where the workers send quantized gradients to the
master. The rounding is the codec's explicit arithmetic, so ``jit`` cannot
elide it as excess precision.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

from optax_q._src.codec import formats as formats_lib
from optax_q._src.codec import qarray as qarray_lib
from optax_q._src.codec import rounding as rounding_lib
from optax_q._src.core import validation
from optax_q._src.state import state_tree

# Stochastic-rounding streams of gradient leaves, apart from the state's
# (leaf indices) and the parameters' (from 2**31).
GRADIENT_STREAM = 0x40000000


class QuantizeGradientsState(NamedTuple):
  """State of [`quantize_gradients`][optax_q.quantize_gradients].

  Attributes:
    count: Steps taken (int32), mixed into the stochastic-rounding bits.
  """

  count: jax.Array


def _layout(fmt: formats_lib.Format, scale_mode: Any, name: str) -> str:
  scale_mode = validation.check_scale(
      qarray_lib.default_scale_mode(fmt) if scale_mode is None
      else scale_mode, name)
  if scale_mode == 'rank1':
    raise ValueError(
        f"{name}='rank1' is a second-moment layout; gradients take "
        "'none', 'tensor', 'row', 'block' or 'block_pow2'.")
  qarray_lib.check_layout(fmt, scale_mode, name)
  return scale_mode


def round_tree(tree: Any, fmt: formats_lib.Format, *, scale_mode: str,
               block_size: int, seed: Any, step: Any, stream: int) -> Any:
  """Every float leaf of ``tree`` rounded to ``fmt`` and decoded.

  ``seed`` is None for round-to-nearest; otherwise leaf ``i`` draws its
  stochastic-rounding bits from stream ``stream + i`` at ``step``.
  """
  flat, treedef = jax.tree_util.tree_flatten(tree)
  out = []
  for index, leaf in enumerate(flat):
    if not state_tree.is_float_array(leaf):
      out.append(leaf)
      continue
    key = (None if seed is None
           else rounding_lib.stream_key(seed, step, stream + index))
    out.append(qarray_lib.round_trip(
        jnp.asarray(leaf), fmt, scale_mode=scale_mode,
        block_size=block_size, key=key))
  return treedef.unflatten(out)


def quantize_gradients(
    fmt: str | formats_lib.Format = 'e4m3',
    *,
    rounding: str = 'stochastic',
    scale_mode: str | None = None,
    block_size: int = 128,
    seed: int = 0,
) -> optax.GradientTransformationExtraArgs:
  r"""Rounds the incoming gradients to ``fmt``; place it first in a chain.

  Each floating-point leaf (scalars included) is divided by its scales,
  rounded to ``fmt``'s grid, and decoded back to its dtype: the gradient
  quantization ``q_G`` of Tang et al.'s framework, set independently of
  the weights' ([`fake_quantize_params`][optax_q.fake_quantize_params]) and the
  moments' ([`quantize_state`][optax_q.quantize_state]);
  [`quantized_training`][optax_q.quantized_training] sets all four. Non-float
  leaves and ``None`` pass through. With `G` the grid of ``fmt``, `g_{\max}`
  its largest value and one scale `s_b` per group `b` of elements (a block
  of ``block_size`` along the last axis, a row, the tensor; `s_b = 1` with
  ``'none'``), a gradient `g_t` becomes

  ```tex
  q_G(g_t) = D(Q(g_t)), \qquad
  D(Q(g_t))_i = s_b\, R_G\!\left(\frac{g_{t,i}}{s_b}\right), \qquad
  s_b = \frac{\max_{j \in b} |g_{t,j}|}{g_{\max}},
  ```

  with `R_G` the rounding of [`quantize_state`][optax_q.quantize_state]:
  to nearest (ties to even), or stochastically to a neighbour so that
  `E[q_G(g_t)] = g_t`, with bits drawn afresh at every step.

  Args:
    fmt: Any signed core format (see [`get_format`][optax_q.get_format]):
      ``'e4m3'``, ``'e5m2'``, a simulated ``'e{E}m{M}'`` (``'e8m7'`` rounds as
      bf16, ``'e8m23'`` without scales changes nothing), ``'int8'``, ...
    rounding: ``'stochastic'`` (unbiased; the bits are a hash of ``seed``,
      the step and the element's position, so runs repeat) or
      ``'nearest'`` (half to even).
    scale_mode: ``'none'``, ``'tensor'``, ``'row'``, ``'block'`` or
      ``'block_pow2'``; None: the format's default (``'block'`` for grids
      narrower than float32's range, which keeps gradients in their normal
      range, ``'none'`` for ``e8m*``, ``bf16`` and ``fp16``).
    block_size: Elements per scale along the last axis for block scales.
    seed: Seed of the stochastic rounding, an int in ``[0, 2**32 - 1]``.

  Returns:
    An Optax gradient transformation whose state counts steps.

  Raises:
    ValueError: at construction, naming the argument, for an unknown or
      unsigned format, scale mode, rounding, block size or seed.

  Examples:
    >>> import jax.numpy as jnp, optax, optax_q
    >>> tx = optax.chain(
    ...     optax_q.quantize_gradients('e5m2', rounding='nearest',
    ...                                scale_mode='none'),
    ...     optax.sgd(1.0))
    >>> g = {'w': jnp.array([1.1, -0.3])}
    >>> tx.update(g, tx.init(g))[0]['w']
    Array([-1.    ,  0.3125], dtype=float32)

  References:
    Tang et al, [A Convergence Analysis of Adaptive Optimizers under
    Floating-point Quantization](https://arxiv.org/abs/2510.21314), 2025
  """
  fmt = formats_lib.check_signed_format(fmt, 'fmt')
  scale_mode = _layout(fmt, scale_mode, 'scale_mode')
  block_size = validation.check_block_size(block_size)
  rounding = validation.check_rounding(rounding)
  seed = validation.check_seed(seed)
  stochastic = rounding == 'stochastic'

  def init_fn(params):
    del params
    return QuantizeGradientsState(count=jnp.zeros([], jnp.int32))

  def update_fn(updates, state, params=None, **extra_args):
    del params, extra_args
    new = round_tree(updates, fmt, scale_mode=scale_mode,
                     block_size=block_size,
                     seed=seed if stochastic else None, step=state.count,
                     stream=GRADIENT_STREAM)
    return new, QuantizeGradientsState(
        count=optax.safe_increment(state.count))

  return optax.GradientTransformationExtraArgs(init_fn, update_fn)

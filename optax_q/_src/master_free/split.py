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
"""Split master weights: bf16 weights plus an integer remainder.

A float32 master ``x`` is held as the bf16 weight ``hi`` the model computes
with and a signed integer ``lo`` in the optimizer state, such that
``x = hi + lo`` in units of float32's last place: with an int16 remainder
every float32 below bf16's overflow threshold is kept exactly, with int8
``x`` rounded to 16 significant bits (Gonzalez Ortiz et al., 2026, weight
splitting). Each step joins the two, runs the inner optimizer in float32 and
splits the new master again, so training equals float32 master-weight
training without a float32 copy of the weights.

The split is integer arithmetic on the bit patterns (sign and magnitude),
so no compiler can elide or re-round it, and every device computes it alike.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from optax_q._src.core import validation
from optax_q._src.master_free import weights
from optax_q._src.state import state_tree

REMAINDERS = ('int16', 'int8')
_SIGN = np.uint32(0x80000000)
_MAGNITUDE = np.uint32(0x7FFFFFFF)
_INF = np.uint32(0x7F800000)
_BF16_MAX = np.uint32(0x7F7F0000)  # bf16's largest finite magnitude.
_BF16_NAN = np.uint32(0x7FC00000)  # bf16's quiet NaN.
_HALF_BF16_ULP = np.uint32(0x8000)
_HIGH_HALF = np.uint32(0xFFFF0000)


class SplitWeightsState(NamedTuple):
  """State of [`split_weights`][optax_q.split_weights].

  Attributes:
    inner_state: The inner optimizer's state (it sees float32 masters).
    remainder: Params-shaped: for each split parameter its remainder
      (int16 or int8, the parameter's shape), None for the others.
  """

  inner_state: Any
  remainder: Any


@dataclasses.dataclass(frozen=True)
class SplitConfig:
  """The static settings of one `split_weights` transform."""

  bits: int  # 16 or 8: the remainder's width.
  filter: Any  # Which float leaves are split (a `weights.Filter`).


def split(x: jax.Array, bits: int = 16) -> tuple[jax.Array, jax.Array]:
  """``(hi, lo)``: the bf16 weight and the remainder of float32 ``x``.

  On the 31 magnitude bits ``m`` of ``x`` (an integer that grows with
  ``|x|``, one per float32 value): with ``bits=8`` ``m`` is first rounded
  to a multiple of 2**8 (16 significant bits, half away from zero); then
  ``hi``'s magnitude is ``m`` rounded to a multiple of 2**16 (bf16's
  nearest, half away from zero, carrying into the exponent as it should)
  and ``lo = (m - hi's) / 2**(16 - bits)``, which lies in
  ``[-2**(bits-1), 2**(bits-1))``. Finite values beyond bf16's largest
  finite plus half its last place keep ``hi`` finite (bf16's max) and
  saturate ``lo`` (the master then off by at most 2**119, about 2**-9
  relative, with int16, under 2**-9 + 2**-16 relative with int8);
  infinities split into themselves and 0; NaN into bf16's quiet NaN and 0.
  """
  drop = 16 - bits
  u = jax.lax.bitcast_convert_type(jnp.asarray(x, jnp.float32), jnp.uint32)
  sign, mag = u & _SIGN, u & _MAGNITUDE
  finite = mag < _INF
  if drop:
    low = np.uint32((1 << drop) - 1)
    mag = jnp.where(finite, (mag + np.uint32(1 << (drop - 1))) & ~low, mag)
  hi = (mag + _HALF_BF16_ULP) & _HIGH_HALF
  hi = jnp.where(finite & (hi >= _INF), _BF16_MAX, hi)
  hi = jnp.where(finite | (mag == _INF), hi, _BF16_NAN)
  lo = jnp.where(finite, mag.astype(jnp.int32) - hi.astype(jnp.int32), 0)
  lo = jnp.clip(lo >> drop, -(1 << (bits - 1)), (1 << (bits - 1)) - 1)
  hi = jax.lax.bitcast_convert_type(
      ((sign | hi) >> 16).astype(jnp.uint16), jnp.bfloat16)
  return hi, lo.astype(jnp.int16 if bits == 16 else jnp.int8)


def join(hi: jax.Array, lo: jax.Array) -> jax.Array:
  """The float32 master ``hi + lo`` (the inverse of `split`).

  The remainder's width is its dtype's: an int8 ``lo`` counts units of
  2**8 float32 last places.
  """
  drop = 16 - 8 * jnp.dtype(lo.dtype).itemsize
  h = jax.lax.bitcast_convert_type(hi, jnp.uint16).astype(jnp.uint32) << 16
  mag = (h & _MAGNITUDE).astype(jnp.int32) + lo.astype(jnp.int32) * (
      1 << drop)
  return jax.lax.bitcast_convert_type(
      (h & _SIGN) | mag.astype(jnp.uint32), jnp.float32)


# Compiled once per shape when called eagerly (split_params, init and
# master_weights outside jit), inlined under jit.
_split = jax.jit(split, static_argnums=1)
_join = jax.jit(join)


def _split_leaf(config: SplitConfig, index, path, leaf):
  """One chosen leaf's ``(hi, lo)``."""
  del index, path
  return _split(leaf, config.bits)


def split_params(
    params: Any,
    remainder: str = 'int16',
    *,
    filter: weights.Filter = 'all',  # pylint: disable=redefined-builtin
) -> Any:
  r"""The bf16 weights a model trained with `split_weights` computes with.

  Each leaf chosen by ``filter`` becomes ``hi`` of its split (bf16's nearest
  value, ties away from zero; with an int8 remainder, of the master rounded
  to 16 significant bits); other leaves are returned as they are. Call
  ``tx.init(params)`` on the float32 params first (it keeps their
  remainders), then this with the same ``remainder`` and ``filter``, and
  drop the float32 params: ``x.astype(jnp.bfloat16)`` would round ties to
  even instead and put such a weight one bf16 step from its master.

  Args:
    params: Float parameters (as given to ``tx.init``).
    remainder: ``'int16'`` or ``'int8'``, as given to
      [`split_weights`][optax_q.split_weights].
    filter: As given to [`split_weights`][optax_q.split_weights].

  Returns:
    ``params`` with the chosen leaves in bf16.

  Raises:
    ValueError: naming the argument, for ``params`` that hold no array, an
      unknown remainder, a filter that is not a callable or returns
      something other than a bool, or a chosen leaf that is not a float
      array.

  Examples:
    >>> import jax.numpy as jnp, optax_q
    >>> params = {'w': jnp.array([1.0 + 2.0**-8, 3.0]), 'step': jnp.array(2)}
    >>> optax_q.split_params(params)['w']
    Array([1.00781, 3], dtype=bfloat16)

  References:
    Gonzalez Ortiz et al, [FlashOptim: Optimizers for Memory Efficient
    Training](https://arxiv.org/abs/2602.23349), 2026
  """
  weights.check_params(params)
  config = SplitConfig(_check_remainder(remainder),
                       _check_filter(filter))
  split = functools.partial(_split_leaf, config)
  return weights.map_chosen(params, config.filter,
                            lambda *args: split(*args)[0])


def _check_remainder(remainder: Any) -> int:
  return {'int16': 16, 'int8': 8}[validation.check_choice(
      remainder, 'remainder', REMAINDERS)]


def _check_filter(filter: Any) -> Any:  # pylint: disable=redefined-builtin
  weights.check_filter(filter)
  return filter


def _init(inner, config: SplitConfig, params) -> SplitWeightsState:
  # Each chosen leaf split once: its remainder, and the float32 master the
  # inner optimizer starts from (what the split keeps of it); the other
  # leaves as they are, with no remainder.
  parts = weights.map_chosen(
      params, config.filter, functools.partial(_split_leaf, config),
      keep=lambda leaf: (leaf, None))
  treedef = jax.tree.structure(params)
  parts = treedef.flatten_up_to(parts)
  masters = [x if lo is None else _join(x, lo) for x, lo in parts]
  return SplitWeightsState(
      inner_state=inner.init(treedef.unflatten(masters)),
      remainder=treedef.unflatten([lo for _, lo in parts]))


def _masters(params, state: SplitWeightsState, where: str) -> tuple:
  """``(treedef, remainders, masters)``, the last two as lists, checked."""
  treedef = jax.tree.structure(params)
  flat_p = treedef.flatten_up_to(params)
  try:
    flat_r = treedef.flatten_up_to(state.remainder)
  except (ValueError, TypeError):
    raise ValueError(
        f'{where}: the state was initialised with params of another '
        f'structure ({jax.tree.structure(state.remainder)}, params: '
        f'{treedef}).') from None
  masters = []
  paths = [path for path, _ in jax.tree_util.tree_flatten_with_path(
      params)[0]]
  for path, p, r in zip(paths, flat_p, flat_r):
    # optax.masked puts a MaskedNode where its mask is False.
    if r is None or isinstance(r, optax.MaskedNode):
      masters.append(p)
      continue
    if jnp.dtype(r.dtype) not in (jnp.dtype(jnp.int16), jnp.dtype(jnp.int8)):
      raise ValueError(
          f'{where}: the remainder of parameter '
          f'{state_tree.path_str(path)!r} is {r.dtype}, not int16 or int8 '
          '(the state of split_weights, restored or cast to another '
          'dtype).')
    if not state_tree.is_float_array(p) or (
        jnp.dtype(p.dtype) != jnp.bfloat16 or p.shape != r.shape):
      raise ValueError(
          f'{where}: parameter {state_tree.path_str(path)!r} is split '
          f'(a {r.dtype} remainder of shape {r.shape}), so it must be the '
          f'bf16 weights of that shape, got '
          f'{getattr(p, "dtype", type(p).__name__)} '
          f'{getattr(p, "shape", "")}: pass optax_q.split_params(params, '
          'remainder, filter=...) with the arguments of split_weights.')
    masters.append(_join(p, r))
  return treedef, flat_r, masters


def _update(inner, config: SplitConfig, updates, state, params=None,
            **extra_args):
  """One step: join, the inner update in float32, split again."""
  del config  # The remainders' dtypes carry the width.
  if params is None:
    raise ValueError(
        'split_weights needs params in update(updates, state, params).')
  treedef, flat_r, masters = _masters(params, state, 'split_weights')
  try:
    flat_g = treedef.flatten_up_to(updates)
  except (ValueError, TypeError) as e:
    raise ValueError('split_weights: the gradients do not have the '
                     f'structure of params: {e}') from None
  grads = [g if r is None else jnp.asarray(g, jnp.float32)
           for g, r in zip(flat_g, flat_r)]
  u, inner_state = optax.with_extra_args_support(inner).update(
      treedef.unflatten(grads), state.inner_state,
      treedef.unflatten(masters), **extra_args)
  new_u, new_r = [], []
  for r, x, du in zip(flat_r, masters, treedef.flatten_up_to(u)):
    if r is None:
      new_u.append(du)
      new_r.append(None)
      continue
    # optax.apply_updates' arithmetic on the float32 master.
    hi, lo = _split(x + jnp.asarray(du, jnp.float32),
                    8 * jnp.dtype(r.dtype).itemsize)
    new_u.append(weights.NewWeights.of_array(hi))
    new_r.append(lo)
  return treedef.unflatten(new_u), SplitWeightsState(
      inner_state=inner_state, remainder=treedef.unflatten(new_r))


def split_weights(
    inner: optax.GradientTransformation,
    remainder: str = 'int16',
    *,
    filter: weights.Filter = 'all',  # pylint: disable=redefined-builtin
) -> optax.GradientTransformationExtraArgs:
  r"""Float32 master weights held as bf16 weights plus an integer remainder.

  The parameters the model computes with are bf16 (from
  [`split_params`][optax_q.split_params]); the state keeps, per split
  parameter, the remainder that makes them the float32 master again. A
  step joins the two, runs ``inner`` on the float32 masters and the
  gradients (cast to float32), adds its update to the masters in float32
  and splits the result: the new bf16 weights are the updates (apply them
  with [`optax_q.apply_updates`][optax_q.apply_updates]), the new
  remainders go to the state. With ``remainder='int16'`` this is float32
  master-weight training bit for bit, at the same 4 bytes per weight and
  without a separate bf16 copy; with ``'int8'`` the master has 16
  significant bits (3 bytes per weight).

  With `m(x)` the 31 magnitude bits of a float32 `x` read as an integer (one
  step per float32 value, carrying into the exponent), `b` the remainder's
  width (16 or 8) and `R_k` rounding to a multiple of `2^k`, ties away from
  zero:

  ```tex
  \tilde m = R_{16-b}(m(x)), \qquad
  m(\mathrm{hi}) = R_{16}(\tilde m), \qquad
  \mathrm{lo} = \frac{\tilde m - m(\mathrm{hi})}{2^{16-b}}
    \in [-2^{b-1}, 2^{b-1}),
  \\
  x_t = \mathrm{join}(\mathrm{hi}_{t-1}, \mathrm{lo}_{t-1}), \qquad
  u_t = \mathrm{inner}(g_t, x_t), \qquad
  (\mathrm{hi}_t, \mathrm{lo}_t) = \mathrm{split}(x_t + u_t),
  ```

  with `hi` keeping `x`'s sign and `join` adding `2^{16-b}\,\mathrm{lo}`
  back to `m(\mathrm{hi})`. `hi` is bf16's nearest value to the master
  (ties away from zero, where round-to-nearest-even would need one more
  remainder value than int16 holds), so every float32 of magnitude below
  `2^{128} - 2^{119} \approx 3.39618 \cdot 10^{38}` (bf16's largest
  finite plus half its last place),
  zeros of either sign, subnormals and infinities come back bit for bit
  with int16; larger finite values keep `hi` at bf16's largest finite and
  are off by at most `2^{119}` (about `2^{-9}` relative); NaN stays NaN.
  With int8 the master is `x` rounded to 16 significant bits:
  `|x - \hat x| \le 2^{-16} |x|` for normal `x`.

  ``filter`` chooses the split leaves, as for
  [`quantize_params`][optax_q.quantize_params]; others keep the dtype the
  user gave them and ``inner``'s plain update. ``inner`` is any Optax
  transform (a chain with clipping, AdamW, Muon, an optax_q optimizer with
  low-bit moments, ...): it sees float32 masters as its ``params``, so
  weight decay reads them. [`quantize_state`][optax_q.quantize_state] may
  also wrap ``split_weights``, and so may ``optax.MultiSteps`` (the zeros it
  returns between its steps keep the weights). ``split_weights`` goes last
  (its updates are new weights, not steps: clip and scale inside or before
  it), and ``optax.apply_updates`` refuses them with a ``TypeError`` naming
  [`optax_q.apply_updates`][optax_q.apply_updates]. Put
  ``optax.apply_if_finite`` inside (around ``inner``): the new weights are
  bit patterns, which it would take for finite.

  Args:
    inner: The optimizer of the float32 masters.
    remainder: ``'int16'`` (lossless: 4 bytes per weight, 2 in the state)
      or ``'int8'`` (24-bit masters: 3 bytes, 1 in the state).
    filter: Which float leaves are split: ``'all'`` (every float leaf of
      rank >= 1), ``'matrices'`` (rank >= 2), None or ``'linear'`` (the
      kernels of linear layers, [`is_linear_kernel`][optax_q.is_linear_kernel])
      or a callable ``(path, leaf) -> bool``.

  Returns:
    A gradient transformation whose state is a
    [`SplitWeightsState`][optax_q.SplitWeightsState]; ``init`` takes the
    float32 params (a chosen leaf given in bf16 starts with remainder 0),
    ``update`` the bf16 ones.

  Raises:
    ValueError: at construction, naming the argument: ``inner`` not a
      transform, ``remainder`` not ``'int16'`` or ``'int8'``, ``filter`` not
      one of its names or a callable. In ``update``: no ``params``, a
      split parameter that is not bf16 of its remainder's shape, or a
      remainder that is not int16 or int8.

  Examples:
    >>> import jax.numpy as jnp, optax, optax_q
    >>> params = {'w': jnp.array([1.0 + 2.0**-12, -3.0]), 'b': jnp.zeros(())}
    >>> tx = optax_q.split_weights(optax.sgd(2.0**-14), 'int16')
    >>> state = tx.init(params)
    >>> params = optax_q.split_params(params, 'int16')
    >>> params['w'].dtype
    dtype(bfloat16)
    >>> grads = {'w': jnp.array([1.0, 0.0]), 'b': jnp.ones(())}
    >>> updates, state = tx.update(grads, state, params)
    >>> params = optax_q.apply_updates(params, updates)
    >>> optax_q.master_weights(params, state)['w']
    Array([ 1.0001831, -3.       ], dtype=float32)

  References:
    Gonzalez Ortiz et al, [FlashOptim: Optimizers for Memory Efficient
    Training](https://arxiv.org/abs/2602.23349), 2026
  """
  validation.check_transform(inner)
  config = SplitConfig(_check_remainder(remainder), _check_filter(filter))
  return optax.GradientTransformationExtraArgs(
      functools.partial(_init, inner, config),
      functools.partial(_update, inner, config))


def master_weights(params: Any, state: Any) -> Any:
  """The float32 master weights of params trained with `split_weights`.

  Joins each split parameter (bf16) with its remainder in ``state``; other
  leaves are returned as they are. Use it to evaluate or export the
  masters (a float32 checkpoint), or to check that the split kept them.

  Args:
    params: The bf16 params ``split_weights`` trains.
    state: Its optimizer state, or any state that holds exactly one
      [`SplitWeightsState`][optax_q.SplitWeightsState] (a chain's, a
      [`quantize_state`][optax_q.quantize_state]'s).

  Returns:
    ``params`` with the split leaves as float32 masters.

  Raises:
    ValueError: if ``state`` holds no or several split states, or
      ``params`` does not match it.

  Examples:
    >>> import jax.numpy as jnp, optax, optax_q
    >>> master = {'w': jnp.array([1.0 + 2.0**-20])}
    >>> tx = optax_q.split_weights(optax.adam(1e-3))
    >>> state = tx.init(master)
    >>> params = optax_q.split_params(master)
    >>> float(params['w'][0]), float(optax_q.master_weights(params, state)[
    ...     'w'][0]) == 1.0 + 2.0**-20
    (1.0, True)
  """
  found = [x for x in jax.tree.leaves(
      state, is_leaf=lambda x: isinstance(x, SplitWeightsState))
           if isinstance(x, SplitWeightsState)]
  # quantize_state's telemetry mirrors the state's structure, with no
  # integer arrays in it: the remainders are where they are.
  held = [x for x in found if any(
      jnp.issubdtype(r.dtype, jnp.integer)
      for r in jax.tree.leaves(x.remainder))]
  if len(held) > 1 or not found:
    raise ValueError(
        'state must hold exactly one SplitWeightsState (the state of '
        f'optax_q.split_weights), found {len(held) or len(found)}.')
  treedef, _, masters = _masters(params, (held or found)[0],
                                 'master_weights')
  return treedef.unflatten(masters)

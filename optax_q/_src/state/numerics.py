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
r"""``check_numerics``: learning rates and ``eps`` against stored precision.

Two host-side checks, run on demand outside ``jit``:

* The learning rate against the weights' stored grid. An Adam-family step
  moves a weight by about `\eta`; rounding to nearest keeps a change only
  if it is at least half the grid spacing at the weight, `\eta \ge
  \mathrm{ulp}(w)/2`, so the largest weights of a low-precision leaf are
  the first to stop moving.
* ``eps`` against the stored second moment. The smallest positive value
  `\nu_{\min}` the stored `v` can hold (absolute for ``bf16`` and ``fp16``,
  the block's scale times the grid's smallest positive value for scaled
  layouts) bounds how well `\sqrt{v} + \epsilon` is known for coordinates
  whose `v` lies below it; ``eps`` must also survive the cast to the dtype
  the denominator is computed in.

Every fact about a format (its grid, smallest normal and positive values,
scales) comes from the `Format` objects and the codec.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from optax_q._src.codec import formats as formats_lib
from optax_q._src.codec import qarray as qarray_lib
from optax_q._src.core import validation
from optax_q._src.state import state_tree
from optax_q._src.state import transform

Format = formats_lib.Format
KINDS = ('learning_rate', 'eps_underflow', 'nu_floor')
ROUNDINGS = ('nearest', 'stochastic')
# Leaves named in a warning; the findings list holds every one.
_SHOWN = 5


class NumericsFinding(NamedTuple):
  r"""One problem [`check_numerics`][optax_q.check_numerics] found in a leaf.

  Attributes:
    kind: ``'learning_rate'`` (the learning rate cannot move the leaf's
      largest weights), ``'eps_underflow'`` (``eps`` rounds to zero in the
      dtype the second moment is computed in) or ``'nu_floor'`` (``eps``
      is below `\sqrt{\nu_{\min}}`, the square root of the smallest positive
      value the stored second moment holds).
    path: The leaf's ``'a/b/c'`` path in ``params`` (``'learning_rate'``)
      or in the state (the other kinds); ``'.'`` for a tree that is one
      leaf.
    stored: How the leaf is stored: a dtype's format (``'bf16'``,
      ``'fp32'``) or a layout tag (``'fp8_e4m3:row'``,
      ``'int8_dynamic_unsigned:block:128'``).
    value: The learning rate or ``eps`` that was checked.
    threshold: The least value that passes: half the spacing at the
      largest weight, the smallest positive value of the dtype, or the
      largest `\sqrt{\nu_{\min}}` among the flagged elements.
    fraction: The share of the leaf's elements affected: weights that a
      step of ``value`` leaves unchanged, or second-moment elements stored
      at or below their floor (NaN for an abstract leaf).
    message: One sentence saying what was found.
  """

  kind: str
  path: str
  stored: str
  value: float
  threshold: float
  fraction: float
  message: str


def _dtype_format(dtype: Any) -> Format:
  """The registry's format of a float dtype (``bf16`` for ``bfloat16``),
  or, for dtypes it has none of (``float64``), one read from ``finfo``."""
  return _format_of(jnp.dtype(dtype))


@functools.cache
def _format_of(dtype: np.dtype) -> Format:
  for name in formats_lib.FORMAT_NAMES:
    try:
      fmt = formats_lib.get_format(name)
    except ValueError:  # A family such as 'e{E}m{M}'.
      continue
    if (fmt.kind == 'float' and not fmt.simulated and not fmt.expand
        and fmt.dtype == dtype):
      return fmt
  info = jnp.finfo(dtype)
  return Format(name=dtype.name, kind='float', bits=int(info.bits),
                storage_dtype=dtype.name, exponent_bits=int(info.nexp),
                mantissa_bits=int(info.nmant), max_value=float(info.max),
                scaled=False, min_normal=float(info.smallest_normal))


def grid_spacing(y: jax.Array, fmt: Format) -> jax.Array:
  r"""The spacing of ``fmt``'s grid at each grid value ``y`` (unscaled).

  The gap from ``y`` to the next value of larger magnitude: for a float
  grid with ``M`` mantissa bits, `\mathrm{ulp}(y) = 2^{\max(e, e_{\min}) -
  M}` with `2^e \le |y| < 2^{e+1}` and `2^{e_{\min}}` the smallest normal
  (at a power of two the gap below is half of it); 1 for integer grids;
  the gap between neighbouring table values for codebooks (at zero, the
  smaller of the two gaps; at the ends, the gap inwards).
  """
  a = jnp.abs(y)
  if fmt.kind == 'int':
    return jnp.ones_like(a)
  if fmt.kind == 'codebook':
    table = np.unique(np.asarray(fmt.table, np.float32))
    gaps = np.diff(table)
    up = jnp.asarray(np.append(gaps, gaps[-1:]), a.dtype)
    down = jnp.asarray(np.insert(gaps, 0, gaps[:1]), a.dtype)
    i = jnp.clip(jnp.searchsorted(jnp.asarray(table, a.dtype), y), 0,
                 table.size - 1)
    return jnp.where(y > 0, up[i], jnp.where(
        y < 0, down[i], jnp.minimum(up[i], down[i])))
  emin = int(round(math.log2(fmt.min_normal)))
  _, k = jnp.frexp(a)  # a = m 2**k, m in [0.5, 1).
  e = jnp.where(a > 0, jnp.maximum(k - 1, emin), emin)
  return jnp.ldexp(jnp.ones_like(a), e - fmt.mantissa_bits)


def _grid_and_scale(q: qarray_lib.QArray) -> tuple[jax.Array, jax.Array]:
  """``(y, s)``: each element's grid value and its scale (``y * s`` is
  its value), read through the codec's decoder."""
  y = qarray_lib.decode(dataclasses.replace(q, scale=None, scale_mode='none'))
  if q.scale is None or q.scale_mode == 'none':
    return y, jnp.ones_like(y)
  # Codes of the grid's target value everywhere, decoded with q's scales.
  target = qarray_lib.scale_target(q.fmt)
  unit = qarray_lib.encode_compiled(
      jnp.ones(q.shape, jnp.float32), q.fmt, scale_mode='tensor',
      block_size=2, key=None)
  s = qarray_lib.decode(dataclasses.replace(q, codes=unit.codes))
  return y, s / jnp.float32(target)


def _stored(leaf: Any) -> tuple[Format, str]:
  if qarray_lib.is_qarray(leaf):
    return leaf.fmt, qarray_lib.layout_tag(leaf)
  fmt = _dtype_format(leaf.dtype)
  return fmt, fmt.name


def _has_values(leaf: Any) -> bool:
  arrays = (leaf.codes,) if qarray_lib.is_qarray(leaf) else (leaf,)
  return all(isinstance(a, (jax.Array, np.ndarray, np.generic))
             for a in arrays)


def _check_concrete(leaf: Any, where: str) -> None:
  arrays = ((leaf.codes, leaf.scale) if qarray_lib.is_qarray(leaf)
            else (leaf,))
  if any(isinstance(a, jax.core.Tracer) for a in arrays):
    raise ValueError(
        f'check_numerics reads values on the host: {where} is traced. Call '
        'it outside jax.jit (on the params and state a step returned), or '
        'on jax.eval_shape results for the checks that need no values.')


def _path(path) -> str:
  """``'a/b/c'``; ``'.'`` for a tree that is one leaf."""
  return state_tree.path_str(path) or '.'


def _float_leaves(tree: Any, name: str, strict: bool = True):
  """``(path, leaf)`` of the float arrays and QArrays of ``tree``; other
  leaves that are not numbers are a ``ValueError`` where ``strict``."""
  flat = jax.tree_util.tree_flatten_with_path(
      tree, is_leaf=qarray_lib.is_qarray)[0]
  for path, leaf in flat:
    where = f'{name}[{state_tree.path_str(path)!r}]'
    if qarray_lib.is_qarray(leaf):
      _check_concrete(leaf, where)
      yield path, leaf
    elif state_tree.is_float_array(leaf):
      _check_concrete(leaf, where)
      yield path, leaf
    elif strict and not (hasattr(leaf, 'dtype')
                         or isinstance(leaf, (int, float))):
      raise ValueError(
          f'{name} must be a pytree of arrays (or jax.ShapeDtypeStruct), '
          f'got a leaf {validation.short(leaf)} of type '
          f'{type(leaf).__name__} at {where}.')


def _weights(leaf: Any) -> tuple[jax.Array, jax.Array]:
  """``(|w|, ulp)``: magnitudes and grid spacing at each stored weight."""
  if qarray_lib.is_qarray(leaf):
    y, s = _grid_and_scale(leaf)
    return jnp.abs(y * s), grid_spacing(y, leaf.fmt) * s
  # float64 stays float64 where JAX keeps it (x64); narrower goes to
  # float32 explicitly (8-bit floats have no implicit promotion).
  dtype = leaf.dtype if jnp.dtype(leaf.dtype).itemsize > 4 else jnp.float32
  w = leaf.astype(dtype)
  return jnp.abs(w), grid_spacing(w, _dtype_format(leaf.dtype))


@jax.jit
def _weight_stats(leaf: Any, lr: jax.Array) -> tuple[jax.Array, ...]:
  """``(largest |w|, half its spacing, weights a step of lr leaves
  unchanged, finite weights)`` of one leaf, compiled once per layout."""
  a, ulp = _weights(leaf)
  finite = jnp.isfinite(a) & jnp.isfinite(ulp)
  # Reductions only (no flattening), so sharded leaves stay as they are.
  largest = jnp.max(jnp.where(finite, a, -1.0))
  at_largest = finite & (a == largest)
  return (largest, jnp.max(jnp.where(at_largest, ulp, 0.0)) / 2,
          jnp.sum(finite & (lr < ulp / 2)), jnp.sum(finite))


def _learning_rate_finding(path: str, leaf: Any, lr: float
                           ) -> NumericsFinding | None:
  if qarray_lib.is_qarray(leaf) and leaf.fmt.expand:
    return None  # Range expansion: the grid is not linear in the scale.
  size = leaf.size if qarray_lib.is_qarray(leaf) else math.prod(leaf.shape)
  if not size or not _has_values(leaf):
    return None
  if not qarray_lib.is_qarray(leaf):
    leaf = jnp.asarray(leaf)  # As JAX holds it (float64 without x64: 32).
  largest, threshold, frozen, finite = (
      float(x) for x in _weight_stats(leaf, jnp.float32(lr)))
  if not finite or not lr < threshold:
    return None
  frozen /= size
  _, stored = _stored(leaf)
  return NumericsFinding(
      'learning_rate', path, stored, lr, threshold, frozen,
      f'{path!r} ({stored}): the largest weight, {largest:.4g}, needs a '
      f'step of at least {threshold:.3g} to change; {frozen:.1%} of the '
      f'weights cannot move by {lr:.3g}.')


def _is_second_moment(path, leaf: Any, root: Any) -> bool:
  if state_tree.field_name(path, root) in transform.NONNEGATIVE_FIELDS:
    return True
  # A field declared non-negative elsewhere is stored in an unsigned
  # variant (`unsigned_variant`): a grid without negatives, or a floor.
  return qarray_lib.is_qarray(leaf) and (
      not leaf.fmt.signed or leaf.fmt.positive_floor)


def _eps_underflow(path: str, leaf: Any, eps: float
                   ) -> NumericsFinding | None:
  # The inner update of a quantized state runs in float32; a plain
  # second moment is computed in its own dtype (as optax does).
  dtype = jnp.float32 if qarray_lib.is_qarray(leaf) else leaf.dtype
  if eps <= 0 or float(np.asarray(eps, dtype)) != 0:
    return None
  fmt = _dtype_format(dtype)
  _, stored = _stored(leaf)
  return NumericsFinding(
      'eps_underflow', path, stored, eps, fmt.min_positive,
      float('nan') if not _has_values(leaf) else 1.0,
      f'{path!r} ({stored}): eps={eps:.3g} rounds to 0 in {fmt.name}, '
      f'whose smallest positive value is {fmt.min_positive:.3g}.')


def _floor_of_unscaled(path: str, leaf: Any, eps: float, fmt: Format,
                       stored: str) -> NumericsFinding | None:
  floor = fmt.min_positive
  if floor is None or not eps < math.sqrt(floor):
    return None
  fraction = float('nan')
  if _has_values(leaf):
    v = (qarray_lib.decode(leaf) if qarray_lib.is_qarray(leaf)
         else jnp.asarray(leaf).astype(jnp.float32))
    # Compared as bit patterns (ordered as the values for v >= 0): bf16's
    # floor is a float32 subnormal, which devices may compare as zero.
    bits = jax.lax.bitcast_convert_type(v, jnp.uint32)
    top = np.float32(floor).view(np.uint32)
    fraction = float(jnp.mean((bits > 0) & (bits <= top)))
  share = ('' if math.isnan(fraction) else
           f'; {fraction:.1%} of the elements are stored at or below it')
  return NumericsFinding(
      'nu_floor', path, stored, eps, math.sqrt(floor), fraction,
      f'{path!r} ({stored}): the smallest positive second moment is '
      f'{floor:.3g}, whose square root {math.sqrt(floor):.3g} exceeds '
      f'eps={eps:.3g}{share}.')


@jax.jit
def _floor_stats(leaf: qarray_lib.QArray, eps: jax.Array
                 ) -> tuple[jax.Array, jax.Array]:
  """``(elements at their block's floor above eps**2, the largest square
  root of such a floor)`` of a scaled second moment."""
  y, _ = _grid_and_scale(leaf)
  v = qarray_lib.decode(leaf)
  root = jnp.sqrt(jnp.where(jnp.isfinite(v) & (v > 0), v, 0.0))
  # Elements at the grid's smallest positive value: their v is the floor
  # of their block (a smaller v is stored there too, or as zero).
  low = (y == jnp.float32(leaf.fmt.min_positive)) & (root > eps)
  return jnp.sum(low), jnp.max(jnp.where(low, root, 0.0), initial=0.0)


def _nu_floor(path: str, leaf: Any, eps: float) -> NumericsFinding | None:
  fmt, stored = _stored(leaf)
  if not qarray_lib.is_qarray(leaf) and jnp.dtype(leaf.dtype).itemsize >= 4:
    return None  # float32 and wider: the reference precision.
  if not qarray_lib.is_qarray(leaf) or leaf.scale_mode == 'none':
    return _floor_of_unscaled(path, leaf, eps, fmt, stored)
  if not _has_values(leaf) or not leaf.size:
    return None  # The floor is the block's scale times the grid's.
  count, threshold = (float(x) for x in _floor_stats(leaf, jnp.float32(eps)))
  if not count:
    return None
  fraction = count / leaf.size
  return NumericsFinding(
      'nu_floor', path, stored, eps, threshold, fraction,
      f'{path!r} ({stored}): {fraction:.1%} of the elements are stored at '
      'their block\'s smallest positive value, whose square root (up to '
      f'{threshold:.3g}) exceeds eps={eps:.3g}.')


def _injected(state: Any, name: str) -> Any:
  """``name`` from the first ``optax.inject_hyperparams`` state holding it."""
  def has(x):
    return isinstance(getattr(x, 'hyperparams', None), dict)
  for node in jax.tree.leaves(state, is_leaf=has):
    if has(node) and name in node.hyperparams:
      value = node.hyperparams[name]
      # An abstract state (jax.eval_shape) holds no value to check.
      return None if isinstance(value, jax.ShapeDtypeStruct) else value
  return None


def _count(state: Any) -> int:
  """The first concrete ``count`` field of ``state``, or 0."""
  for path, leaf in jax.tree_util.tree_flatten_with_path(state)[0]:
    if (state_tree.field_name(path) == 'count'
        and isinstance(leaf, (jax.Array, np.ndarray))
        and not isinstance(leaf, jax.core.Tracer) and leaf.shape == ()
        and jnp.issubdtype(leaf.dtype, jnp.integer)):
      return int(leaf)
  return 0


def _number(value: Any) -> Any:
  """A concrete float array as float64 NumPy, which `check_number` reads
  whatever its dtype (an injected ``bfloat16`` hyperparameter); anything
  else as it is."""
  if (isinstance(value, (jax.Array, np.ndarray, np.generic))
      and not isinstance(value, jax.core.Tracer)
      and jnp.issubdtype(value.dtype, jnp.floating)):
    return np.asarray(value, np.float64)
  return value


def _learning_rate(learning_rate: Any, state: Any, step: Any) -> Any:
  """The learning rate to check (a float), or None."""
  if learning_rate is None:
    learning_rate = _injected(state, 'learning_rate')
  if learning_rate is None:
    return None
  hint = ' check_numerics runs outside jit: pass a concrete value.'
  value = validation.check_number(_number(learning_rate), 'learning_rate',
                                  schedule=True, concrete=True, hint=hint)
  if not callable(value):
    return value
  step = _count(state) if step is None else step
  return validation.check_number(
      _number(value(step)), f'learning_rate (the schedule at step {step})',
      concrete=True, hint=hint)


def _warning(kind: str, findings: list[NumericsFinding], total: int,
             rounding: str) -> str:
  """One message for all findings of ``kind``, the worst first."""
  worst = sorted(findings, key=lambda f: -f.threshold)
  shown = ' '.join(f.message for f in worst[:_SHOWN])
  more = (f' (and {len(worst) - _SHOWN} more leaves: see the returned '
          'findings)' if len(worst) > _SHOWN else '')
  value = worst[0].value
  if kind == 'learning_rate':
    return (
        f'learning_rate={value:.3g} is too small to move the largest '
        f'weights at their stored precision in {len(worst)} of {total} '
        f'leaves. {shown}{more} An Adam-family step moves a weight by '
        'about the learning rate, and rounding to nearest drops a change '
        'below half the grid spacing at the weight. Raise the learning '
        'rate, keep float32 master weights, or write the weights with '
        'stochastic rounding (as optax_q.eco does by default), which keeps '
        'small updates in expectation; if they are written so, pass '
        f"rounding='stochastic' (this check assumed {rounding!r}).")
  if kind == 'eps_underflow':
    return (
        f'eps={value:.3g} rounds to 0 in the dtype the second moment is '
        f'computed in, in {len(worst)} leaves. {shown}{more} A coordinate '
        'with zero gradients then divides 0 by 0 (NaN). Raise eps above '
        'the threshold, or keep the second moment in float32 (optax_q '
        'stores it quantized and computes in float32).')
  return (
      f'eps={value:.3g} is below the square root of the smallest positive '
      f'value the stored second moment can hold, in {len(worst)} leaves. '
      f'{shown}{more} A second moment below that floor is stored as zero '
      '(or raised to the floor), so sqrt(v) + eps is known only to within '
      'the square root of the floor, more than eps: those coordinates take '
      'steps far too large (v read as zero) or too small (v raised). Raise '
      'eps to the largest threshold named, or store the second moment with '
      'more range (bf16, a smaller block_size, int8_dynamic).')


def _check_args(state, learning_rate, eps, step, rounding, warn):
  """Checked ``(learning rate, eps, rounding, warn)`` of `check_numerics`
  (None for a check that has nothing to check with)."""
  if (callable(getattr(state, 'init', None))
      and callable(getattr(state, 'update', None))):
    raise ValueError(
        'state must be an optimizer state (tx.init(params) or a later '
        'state), got an Optax transformation.')
  rounding = validation.check_choice(rounding, 'rounding', ROUNDINGS)
  warn = validation.check_bool(warn, 'warn')
  if step is not None:
    step = validation.check_int(step, 'step')
  lr = _learning_rate(learning_rate, state, step)
  if eps is None:
    eps = _injected(state, 'eps')
  elif state is None:
    raise ValueError(
        'eps is checked against the stored second moment: pass the '
        'optimizer state as well (state=tx.init(params), or '
        'jax.eval_shape(tx.init, params)).')
  if eps is not None:
    eps = validation.check_number(_number(eps), 'eps', concrete=True)
  if lr is None and eps is None:
    raise ValueError(
        'Nothing to check: pass learning_rate (a float or schedule) and/or '
        'eps with the state, or a state made with optax.inject_hyperparams '
        'that holds them.')
  return lr, eps, rounding, warn


def _eps_findings(state: Any, eps: float,
                  found: dict[str, list[NumericsFinding]]) -> list[str]:
  """Adds the ``eps`` findings of ``state``'s second moments to ``found``;
  returns the second moments' paths."""
  moments = []
  for path, leaf in _float_leaves(state, 'state', strict=False):
    if not _is_second_moment(path, leaf, state):
      continue
    where = _path(path)
    moments.append(where)
    for kind, check in (('eps_underflow', _eps_underflow),
                        ('nu_floor', _nu_floor)):
      f = check(where, leaf, eps)
      if f is not None:
        found[kind].append(f)
  return moments


def check_numerics(
    params: Any,
    state: Any = None,
    *,
    learning_rate: Any = None,
    eps: Any = None,
    step: int | None = None,
    rounding: str = 'nearest',
    warn: bool = True,
) -> list[NumericsFinding]:
  r"""Checks a learning rate and ``eps`` against the stored precision.

  A cheap, on-demand check (host-side, a few reductions per leaf; call it
  outside ``jit``, say once after the first steps) for the two silent
  failures of low-precision training.

  **Learning rate too small for the stored weights** (kind
  ``'learning_rate'``). An Adam-family step moves a weight by about the
  learning rate `\eta` (`|u| = \eta |\hat m| / (\sqrt{\hat v} +
  \epsilon) \approx \eta`; exactly `\eta` for Lion). Rounding to nearest
  keeps a change of `w` only if it reaches half the grid spacing there,
  so the check flags a leaf when

  ```tex
  \eta < \tfrac{1}{2}\, \mathrm{ulp}(w_{\max}), \qquad
  \mathrm{ulp}(w) = s\, 2^{\max(e, e_{\min}) - M}
  \quad (2^e \le |w|/s < 2^{e+1}),
  ```

  with `w_{\max}` the leaf's largest weight, `M` the grid's mantissa bits,
  `2^{e_{\min}}` its smallest normal value and `s` the element's scale (1
  for a plain ``bfloat16``, ``float16`` or fp8 array; the row's or
  block's scale for a [`QArray`][optax_q.QArray] from
  [`quantize_params`][optax_q.quantize_params]; integer grids have
  spacing `s`, codebooks the gap to the next table value). For ``bf16``
  weights of magnitude 1 the threshold is `2^{-8} \approx 0.0039`. The
  finding also gives the fraction of weights with
  `\eta < \mathrm{ulp}(w)/2`, which a step of `\eta` leaves unchanged. At
  a power of two the gap below is half the gap above, so such a weight can
  still shrink with half the threshold. For plain SGD the step is
  `\eta |g|`: pass that product as ``learning_rate``. With
  ``rounding='stochastic'`` this check is off: stochastic rounding keeps
  every update in expectation, `E[Q(w + u)] = w + u` (Zamirai et al.,
  2020), at the cost of noise.

  **eps rounds to zero** (kind ``'eps_underflow'``). Optax computes
  `\sqrt{v} + \epsilon` in the second moment's dtype: ``eps=1e-8`` is 0
  in ``float16`` (smallest positive value `2^{-24} \approx 5.96 \cdot
  10^{-8}`), and a coordinate with zero gradients divides 0 by 0. A
  quantized state is computed in float32. Flagged when ``eps`` rounds to
  0 in that dtype; a rounded but nonzero ``eps`` (``bfloat16(1e-7)``,
  0.1% off) changes nothing that matters.

  **eps below the second moment's floor** (kind ``'nu_floor'``). The stored
  second moment holds no positive value below `\nu_{\min}`: the format's
  smallest positive value (subnormals included) for an unscaled layout
  (`5.96 \cdot 10^{-8}` for ``fp16``, `9.2 \cdot 10^{-41}` for ``bf16``),
  and the block's scale times the grid's smallest positive value for a
  scaled one (float32 and wider second moments are the reference and are
  not checked). A `v < \nu_{\min}` is stored as 0 (or raised to
  `\nu_{\min}` by a second-moment format's floor, see
  [`unsigned_variant`][optax_q.unsigned_variant]), so the denominator
  `\sqrt{v} + \epsilon` of such a coordinate is off by up to
  `\sqrt{\nu_{\min}}`, and by less than a factor of 2 only where
  `\epsilon \ge \sqrt{\nu_{\min}}`. The check flags

  ```tex
  \epsilon^2 < \nu_{\min}
  ```

  for an unscaled layout from the format alone (abstract states too), for a
  scaled one per element, at the elements stored at their block's
  smallest positive value (true zeros of a grid without zero, such as
  ``int4``, count too: an upper bound). The bf16 second moment that never
  decays under rounding to nearest is a different trap: see
  [`stall_probability`][optax_q.stall_probability] and
  [`stall_fraction`][optax_q.stall_fraction].

  Args:
    params: The parameters: arrays of any float dtype,
      [`QArray`][optax_q.QArray]s from
      [`quantize_params`][optax_q.quantize_params], or
      ``jax.ShapeDtypeStruct``s (abstract leaves skip the learning-rate
      check, which needs values).
    state: The optimizer state, or None. Its second moments (the fields of
      [`NONNEGATIVE_FIELDS`][optax_q.NONNEGATIVE_FIELDS], and quantized
      leaves in an unsigned format) are checked against ``eps``; an
      ``optax.inject_hyperparams`` state supplies ``learning_rate`` and
      ``eps`` where they are not given, and its ``count`` the step of a
      schedule. ``jax.eval_shape(tx.init, params)`` works for the checks
      that need no values (its injected hyperparameters, abstract, are
      not read).
    learning_rate: A non-negative float, a scalar array, or an Optax
      schedule (evaluated at ``step``); None: read from ``state``, or the
      learning-rate check is skipped. 0 skips it.
    eps: Adam's ``eps``, a non-negative float; None: read from ``state``,
      or the ``eps`` checks are skipped.
    step: The step a schedule is evaluated at, an int >= 0; None: the
      state's first ``count``, or 0.
    rounding: How the weights are written: ``'nearest'`` (the default, as
      ``optax.apply_updates`` adds in the weights' dtype) or
      ``'stochastic'`` (the learning-rate check is then off).
    warn: Emit one ``UserWarning`` per kind found, naming the worst leaves,
      their numbers, the threshold and what to change.

  Returns:
    The findings, a list of [`NumericsFinding`][optax_q.NumericsFinding]
    (empty when all is well), by kind (``'learning_rate'``,
    ``'eps_underflow'``, ``'nu_floor'``), each kind in the order of the
    leaves.

  Raises:
    ValueError: naming the argument, for a bad ``learning_rate``, ``eps``,
      ``step`` or ``rounding``, params that are not a pytree of arrays,
      traced leaves (inside ``jit``), an Optax transformation
      passed as ``state``, ``eps`` without a state, or nothing to check.

  Examples:
    >>> import jax.numpy as jnp, optax_q
    >>> params = {'scale': jnp.ones(8, jnp.bfloat16)}
    >>> found = optax_q.check_numerics(params, learning_rate=1e-4, warn=False)
    >>> found[0].kind, found[0].threshold
    ('learning_rate', 0.00390625)
    >>> optax_q.check_numerics(params, learning_rate=1e-2)
    []

  References:
    Zamirai et al, [Revisiting BFloat16
    Training](https://arxiv.org/abs/2010.06192), 2020

    Gonzalez Ortiz et al, [FlashOptim: Optimizers for Memory-Efficient
    Training](https://arxiv.org/abs/2602.23349), 2026 (``check_numerics``)

    Li et al, [Memory Efficient Optimizers with 4-bit
    States](https://arxiv.org/abs/2309.01507), 2023
  """
  lr, eps, rounding, warn = _check_args(
      state, learning_rate, eps, step, rounding, warn)
  leaves = list(_float_leaves(params, 'params'))
  found = {kind: [] for kind in KINDS}
  if lr and rounding == 'nearest':
    for path, leaf in leaves:
      f = _learning_rate_finding(_path(path), leaf, lr)
      if f is not None:
        found['learning_rate'].append(f)
  moments = [] if eps is None else _eps_findings(state, eps, found)
  if warn:
    for kind, findings in found.items():
      if findings:
        total = len(leaves) if kind == 'learning_rate' else len(moments)
        validation.warn(_warning(kind, findings, total, rounding))
  return [f for kind in KINDS for f in found[kind]]

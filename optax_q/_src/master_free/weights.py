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
"""Quantized parameters: weights that live in a low-precision format.

`quantize_params` turns chosen parameter leaves into `QArray`
s (the core codec: the same formats, scales and rounding as the optimizer
state), `dequantize_params` decodes them for a forward pass,
`apply_updates` writes an optimizer's result into them, and
`fake_quantize_params` gives a forward pass quantized weights while
float32 master weights take the gradient (straight through).
"""

from __future__ import annotations

from collections.abc import Callable
import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from optax_q._src.codec import formats as formats_lib
from optax_q._src.codec import qarray as qarray_lib
from optax_q._src.codec import rounding as rounding_lib
from optax_q._src.core import validation
from optax_q._src.state import state_tree

QArray = qarray_lib.QArray
Filter = Callable[[Any, Any], bool] | str | None

# Module names whose kernels the default filter leaves in float: input
# embeddings and output layers (ECO, like QuEST, quantizes the linear layers
# inside the transformer blocks only).
EXCLUDED_MODULES = ('embed', 'head', 'logits', 'output', 'unembed')
FILTERS = ('linear', 'matrices', 'all')
# Stochastic-rounding streams of parameters, apart from those of optimizer
# state leaves (which count up from 0); quantize_params draws at a step
# that training steps reach only after 2**32 - 1 updates.
PARAM_STREAM = 0x80000000
_INITIAL_STEP = 0xFFFFFFFF
_UINT = {1: jnp.uint8, 2: jnp.uint16, 4: jnp.uint32}


def _bits_of(x: jax.Array) -> jax.Array:
  return jax.lax.bitcast_convert_type(x, _UINT[jnp.dtype(x.dtype).itemsize])


_APPLY_HINT = ('new weights from optax_q.eco or optax_q.split_weights: '
               'apply them with optax_q.apply_updates(params, updates), not '
               'optax.apply_updates')


class _NamedWithHint(type):
  """Shows how to apply `NewWeights` wherever the type is printed: the
  pytree structure error of ``optax.apply_updates`` names it."""

  def __repr__(cls):
    return f"<class '{cls.__module__}.{cls.__qualname__}' ({_APPLY_HINT})>"


@dataclasses.dataclass(frozen=True)
class NewWeights(metaclass=_NamedWithHint):
  """The update `optax_q.eco` gives a quantized parameter (and
  `optax_q.split_weights` a bf16 one): its new value, to be written by
  `optax_q.apply_updates`.

  Apply these updates with ``optax_q.apply_updates(params, updates)``, not
  ``optax.apply_updates`` (nor an optimizer wrapper that calls it, such as
  Flax's): those fail with an error that names this type (a pytree
  structure error for a quantized parameter, a ``TypeError`` for a plain
  one), since the codes and scales are held as their bit patterns (unsigned
  integers) instead of values to add. A transform placed after ``eco`` that
  rescales the updates turns them into floats, which `apply_updates`
  refuses.
  """

  codes: jax.Array
  scale: jax.Array | None
  # The QArray's layout, or a plain parameter's jax.ShapeDtypeStruct.
  like: QArray = dataclasses.field(metadata=dict(static=True))
  # A plain parameter's: 1 (uint8), so that the zeros a wrapper puts in
  # place of a step (optax.MultiSteps between its updates) keep the
  # parameter instead of writing zero weights.
  applied: jax.Array | None = None

  @classmethod
  def of(cls, q: QArray) -> 'NewWeights':
    like = dataclasses.replace(q, codes=None, scale=None)
    return cls(_bits_of(q.codes),
               None if q.scale is None else _bits_of(q.scale), like)

  @classmethod
  def of_array(cls, x: jax.Array) -> 'NewWeights':
    """The new value of a plain parameter, bit for bit."""
    return cls(_bits_of(x), None, jax.ShapeDtypeStruct(x.shape, x.dtype),
               jnp.ones((), jnp.uint8))

  def __add__(self, other):
    raise TypeError(f'{_APPLY_HINT}: these updates are new values, not '
                    'steps to add.')

  __radd__ = __add__

  def _plain(self, param: jax.Array, where: str) -> jax.Array:
    """The new value of the plain parameter ``param``."""
    dtype = jnp.dtype(param.dtype)
    if (tuple(param.shape), dtype) != (self.like.shape, self.like.dtype):
      raise ValueError(
          f'updates[{where!r}] holds new weights of shape {self.like.shape} '
          f'and dtype {self.like.dtype}, the parameter {param.shape} '
          f'{dtype}.')
    want = _UINT[dtype.itemsize]
    if jnp.dtype(self.codes.dtype) != jnp.dtype(want):
      raise ValueError(
          f'updates[{where!r}] was changed after the transform that returned '
          f'new weights (its bits are {self.codes.dtype}, not '
          f'{jnp.dtype(want).name}): it must be the last transform of the '
          'chain (clip and scale before it).')
    new = jax.lax.bitcast_convert_type(self.codes, dtype)
    if self.applied is None:
      return new
    return jnp.where(self.applied != 0, new, param)

  def weights(self, param: Any, where: str) -> Any:
    """The new QArray (or plain array), checked against the parameter's
    layout."""
    if not qarray_lib.is_qarray(self.like):
      if qarray_lib.is_qarray(param):
        raise ValueError(
            f'updates[{where!r}] holds new plain weights but the parameter '
            f'is quantized ({qarray_lib.layout_tag(param)}).')
      return self._plain(param, where)
    if not qarray_lib.is_qarray(param):
      raise ValueError(
          f'updates[{where!r}] holds new quantized weights but the '
          'parameter is a plain array.')
    if (param.fmt, param.shape, param.scale_mode, param.block_size) != (
        self.like.fmt, self.like.shape, self.like.scale_mode,
        self.like.block_size):
      raise ValueError(
          f'updates[{where!r}] has layout {qarray_lib.layout_tag(self.like)}'
          f' {self.like.shape}, the parameter '
          f'{qarray_lib.layout_tag(param)} {param.shape}.')
    parts = [(self.codes, param.codes)]
    if self.scale is not None:
      parts.append((self.scale, param.scale))
    for new, old in parts:
      want = _UINT[jnp.dtype(old.dtype).itemsize]
      if jnp.dtype(new.dtype) != jnp.dtype(want):
        raise ValueError(
            f'updates[{where!r}] was changed after optax_q.eco (its codes '
            f'are {new.dtype}, not {jnp.dtype(want).name}): eco returns '
            'the new quantized weights, so it must be the last transform '
            'of the chain (clip and scale before it).')
    codes = jax.lax.bitcast_convert_type(self.codes, param.codes.dtype)
    scale = (None if self.scale is None else
             jax.lax.bitcast_convert_type(self.scale, param.scale.dtype))
    return dataclasses.replace(param, codes=codes, scale=scale)


jax.tree_util.register_dataclass(
    NewWeights, data_fields=['codes', 'scale', 'applied'],
    meta_fields=['like'])


def is_new_weights(x: Any) -> bool:
  return isinstance(x, NewWeights)


def key_name(key: Any) -> str:
  """The name of one path entry (a dict key, an attribute, an index)."""
  for attr in ('key', 'name', 'idx'):
    if hasattr(key, attr):
      return str(getattr(key, attr))
  return str(key)


def is_linear_kernel(path: Any, leaf: Any) -> bool:
  """The default filter of [`quantize_params`][optax_q.quantize_params]:
  linear-layer kernels.

  A leaf qualifies when it is a float array of rank >= 2 named ``kernel``
  and no enclosing module name contains ``embed`` or is an output layer
  (``head``, ``lm_head``, ``logits``, ``output``, ``unembed``): the 2-D
  ``Dense`` kernels and the 3-D ``DenseGeneral`` attention kernels of a
  transformer's blocks, not its embeddings, output head, norms or biases.

  Args:
    path: The leaf's key path (as ``jax.tree_util`` gives it).
    leaf: The leaf.

  Returns:
    Whether the leaf is quantized by default.

  Examples:
    >>> import jax, jax.numpy as jnp, optax_q
    >>> params = {'block': {'fc': {'kernel': jnp.ones((4, 8))}},
    ...           'embed': {'embedding': jnp.ones((16, 4))},
    ...           'head': {'kernel': jnp.ones((4, 16))}}
    >>> jax.tree_util.tree_map_with_path(optax_q.is_linear_kernel, params)
    {'block': {'fc': {'kernel': True}}, 'embed': {'embedding': False}, 'head': {'kernel': False}}
  """
  names = [key_name(k).lower() for k in path]
  if names and names[-1] == 'value':  # A Flax NNX Variable's value.
    names = names[:-1]
  if not names or names[-1] != 'kernel':
    return False
  if not state_tree.is_float_array(leaf) or leaf.ndim < 2:
    return False
  return not any('embed' in n or n in EXCLUDED_MODULES or n.endswith('_head')
                 for n in names[:-1])


def check_filter(filter: Filter, name: str = 'filter'  # pylint: disable=redefined-builtin
                 ) -> Callable[[Any, Any], bool]:
  """``filter`` as a callable ``(path, leaf) -> bool``."""
  if filter is None or filter == 'linear':
    return is_linear_kernel
  if filter == 'all':  # Every float leaf of rank >= 1.
    return lambda path, leaf: (state_tree.is_float_array(leaf)
                               and leaf.ndim >= 1)
  if filter == 'matrices':  # Every float leaf of rank >= 2.
    return lambda path, leaf: (state_tree.is_float_array(leaf)
                               and leaf.ndim >= 2)
  if isinstance(filter, str) or not callable(filter):
    raise ValueError(
        f'{name} must be None, one of {FILTERS} or a callable '
        f'(path, leaf) -> bool, got {validation.short(filter)}.')
  return filter


def check_weight_format(fmt: Any, name: str = 'fmt') -> formats_lib.Format:
  """A core format that can hold negative weights."""
  return formats_lib.check_signed_format(fmt, name)


def check_stored_format(fmt: formats_lib.Format, name: str) -> None:
  """Quantized parameters take a format narrower than float32."""
  if fmt.is_identity:
    raise ValueError(
        f'{name}={fmt.name!r} stores float32 values as they are: nothing to '
        'quantize. Pass a narrower format (fp8_e4m3, int8, int4, nf4, bf16, '
        '...), or keep the float parameters.')


def default_weight_scale_mode(fmt: formats_lib.Format) -> str:
  """Row-wise scales for scaled formats (ECO's fp8 setting), none else."""
  return 'row' if fmt.scaled else 'none'


def param_key(seed, step, index: int) -> jax.Array:
  """The stochastic-rounding key of parameter leaf ``index`` at ``step``
  (streams apart from the optimizer state's)."""
  return rounding_lib.stream_key(seed, step, PARAM_STREAM + index)


def _weight_layout(fmt, scale_mode, block_size, rounding,
                   name: str = 'scale_mode'):
  """Checked ``(fmt, scale_mode, block_size)`` of a weight codec."""
  fmt = check_weight_format(fmt)
  scale_mode = validation.check_scale(
      default_weight_scale_mode(fmt) if scale_mode is None else scale_mode,
      name)
  qarray_lib.check_layout(fmt, scale_mode, name)
  validation.check_rounding(rounding)
  return fmt, scale_mode, validation.check_block_size(block_size)


def map_chosen(params: Any, filter: Filter, fn, *,  # pylint: disable=redefined-builtin
               require: bool = False, keep=None) -> Any:
  """``fn(index, path, leaf)`` on the float leaves ``filter`` chooses;
  ``keep(leaf)`` on the others (None: as they are)."""
  chosen = check_filter(filter)
  flat, treedef = jax.tree_util.tree_flatten_with_path(
      params, is_leaf=qarray_lib.is_qarray)
  out = []
  for index, (path, leaf) in enumerate(flat):
    if qarray_lib.is_qarray(leaf):
      raise ValueError(
          f'parameter {state_tree.path_str(path)!r} is already quantized '
          f'({qarray_lib.layout_tag(leaf)}); pass the float parameters.')
    # The filter's answer: a Python, NumPy or concrete 0-d jax bool.
    answer = chosen(path, leaf)
    if not isinstance(answer, (bool, np.bool_)) and not (
        isinstance(answer, (np.ndarray, jax.Array)) and answer.shape == ()
        and answer.dtype == bool and not isinstance(answer, jax.core.Tracer)):
      raise ValueError(
          'filter must return a bool (True to quantize the leaf), but '
          f'returned {validation.short(answer)} of type '
          f'{type(answer).__name__} for parameter '
          f'{state_tree.path_str(path)!r}.')
    if not bool(answer):
      out.append(leaf if keep is None else keep(leaf))
      continue
    if not state_tree.is_float_array(leaf):
      raise ValueError(
          f'parameter {state_tree.path_str(path)!r} is not a floating-point '
          f'array ({getattr(leaf, "dtype", type(leaf).__name__)}); '
          'quantize_params quantizes float leaves only (check filter).')
    out.append(fn(index, path, leaf))
  if require and flat and all(a is b for a, b in zip(
      out, (leaf for _, leaf in flat))):
    raise ValueError(
        'filter chose no parameter of params to quantize (the default '
        "takes leaves named 'kernel' of rank >= 2 outside embeddings and "
        'output layers); '
        "pass filter='matrices', 'all' or a callable (path, leaf) -> bool.")
  return treedef.unflatten(out)


def check_params(params: Any, name: str = 'params', *,
                 empty: bool = False) -> None:
  """``params`` is a pytree whose leaves are arrays (or QArrays): a string,
  an object (or, unless ``empty``, a tree without any array) is a
  ``ValueError`` naming ``name``."""
  leaves = jax.tree.leaves(params, is_leaf=qarray_lib.is_qarray)
  for leaf in leaves:
    if not (qarray_lib.is_qarray(leaf) or isinstance(
        leaf, (jax.Array, np.ndarray, np.generic, jax.ShapeDtypeStruct,
               int, float, complex))):
      raise ValueError(
          f'{name} must be a pytree of arrays (dicts, lists, Flax params), '
          f'got a leaf {validation.short(leaf)} of type '
          f'{type(leaf).__name__}.')
  if not leaves and not empty:
    raise ValueError(
        f'{name} must be a pytree of arrays (dicts, lists, Flax params), got '
        f'{validation.short(params)}, which holds no array.')


def quantize_params(
    params: Any,
    fmt: str | formats_lib.Format = 'fp8_e4m3',
    *,
    scale_mode: str | None = None,
    block_size: int = 128,
    filter: Filter = None,  # pylint: disable=redefined-builtin
    rounding: str = 'nearest',
    seed: int = 0,
    scale: Any = validation.UNSET,
) -> Any:
  r"""Stores chosen parameter leaves as [`QArray`][optax_q.QArray]s.

  The chosen leaves then live in ``fmt``: their float copy is gone (the
  caller drops the float tree), a forward pass decodes them
  ([`dequantize_params`][optax_q.dequantize_params], inside the compiled step),
  and [`optax_q.eco`][optax_q.eco] with [`apply_updates`][optax_q.apply_updates]
  trains them without master weights. Other leaves are returned as they are.
  A chosen leaf `w` becomes `\hat w = Q(w)`: with `G` the grid of ``fmt``,
  `g_{\max}` its largest value and, by default, one scale per row `r` (the
  slice along the last axis; per block, per tensor, or `s = 1` with the
  other scale modes), it stores the scales and codes

  ```tex
  s_r = \frac{\max_j |w_{rj}|}{g_{\max}}, \qquad
  c_{rj} = R_G\!\left(\frac{w_{rj}}{s_r}\right), \qquad
  D(\hat w)_{rj} = s_r\, c_{rj},
  ```

  with `R_G` the rounding of [`quantize_state`][optax_q.quantize_state]
  (to nearest by default) and `D` the decoding.

  Args:
    params: A parameter pytree (plain arrays, e.g. Flax Linen params).
    fmt: Any core format: ``'fp8_e4m3'`` (the ECO paper's), ``'int4'``,
      ``'bf16'``, ``'int8'``, ...
    scale_mode: ``'row'`` (one scale per slice along the last axis, the
      paper's row-wise absmax), ``'tensor'``, ``'block'``, ``'block_pow2'``
      or ``'none'`` (float formats only); None: ``'row'`` for formats with
      a narrow range, ``'none'`` for ``bf16`` and ``fp16``.
    block_size: Elements per scale along the last axis for block scales.
    filter: Which leaves to quantize: None or ``'linear'`` (the kernels of
      linear layers, [`is_linear_kernel`][optax_q.is_linear_kernel]),
      ``'matrices'`` (every float leaf of rank >= 2: embeddings and the output
      head too), ``'all'`` (every float leaf of rank >= 1) or a callable
      ``(path, leaf) -> bool``.
    rounding: ``'nearest'`` or ``'stochastic'``.
    seed: Seed of the stochastic rounding, an int in ``[0, 2**32 - 1]``.
    scale: Another name of ``scale_mode`` (deprecated, as in
      [`quantize`][optax_q.quantize]).

  Returns:
    ``params`` with the chosen leaves replaced by [`QArray`][optax_q.QArray]s
    of the leaves' shapes and dtypes.

  Raises:
    ValueError: naming the argument, for ``params`` that hold no array, an
      unknown format (or ``'fp32'``, which quantizes nothing), scale mode or
      rounding, a filter that is not a callable or returns something other
      than a bool, a chosen leaf that is not a float array, or a leaf that
      is already quantized.

  Examples:
    >>> import jax.numpy as jnp, optax_q
    >>> params = {'dense': {'kernel': jnp.ones((4, 8)), 'bias': jnp.ones(8)}}
    >>> q = optax_q.quantize_params(params, 'fp8_e4m3')
    >>> q['dense']['kernel'].codes.dtype, q['dense']['kernel'].scale.shape
    (dtype(float8_e4m3fn), (4, 1))
    >>> optax_q.is_qarray(q['dense']['bias'])
    False

  References:
    Nikdan et al, [ECO: Quantized Training without Full-Precision Master
    Weights](https://arxiv.org/abs/2601.22101), 2026
  """
  check_params(params)
  name, scale_mode = validation.renamed('scale', scale, 'scale_mode',
                                        scale_mode)
  fmt, scale_mode, block_size = _weight_layout(
      fmt, scale_mode, block_size, rounding, name)
  check_stored_format(fmt, 'fmt')
  seed = validation.check_seed(seed)

  def encode(index, path, leaf):
    del path
    qarray_lib.check_layout(fmt, scale_mode, name, leaf.shape)
    key = (param_key(seed, _INITIAL_STEP, index)
           if rounding == 'stochastic' else None)
    return qarray_lib.encode_compiled(
        leaf, fmt, scale_mode=scale_mode, block_size=block_size, key=key)

  return map_chosen(params, filter, encode, require=True)


def dequantize_params(params: Any, dtype: Any = None) -> Any:
  """Decodes the [`QArray`][optax_q.QArray] leaves of ``params`` (others as they
  are).

  Call it inside the compiled step, on the way into the forward pass: the
  decoded weights are temporaries of that step, never stored.

  Args:
    params: A parameter pytree, some leaves [`QArray`][optax_q.QArray]s.
    dtype: The float dtype to decode to; None for each leaf's own dtype.

  Returns:
    The parameters as plain arrays.

  Raises:
    ValueError: if ``params`` is not a pytree of arrays, or ``dtype`` not a
      float dtype.

  Examples:
    >>> import jax.numpy as jnp, optax_q
    >>> q = optax_q.quantize_params({'kernel': jnp.full((2, 4), 0.5)}, 'bf16')
    >>> optax_q.dequantize_params(q)['kernel'][0]
    Array([0.5, 0.5, 0.5, 0.5], dtype=float32)
  """
  check_params(params, empty=True)
  return jax.tree.map(
      lambda x: qarray_lib.dequantize(x, dtype)
      if qarray_lib.is_qarray(x) else x, params, is_leaf=qarray_lib.is_qarray)


def quantized_paths(params: Any) -> list[str]:
  """The ``'a/b/c'`` paths of the `QArray` leaves of ``params``."""
  flat = jax.tree_util.tree_flatten_with_path(
      params, is_leaf=qarray_lib.is_qarray)[0]
  return [state_tree.path_str(p) for p, x in flat if qarray_lib.is_qarray(x)]


def apply_updates(params: Any, updates: Any) -> Any:
  """Applies updates to parameters that may be quantized.

  A quantized parameter (a [`QArray`][optax_q.QArray]) is replaced by its
  update: the new weights that [`optax_q.eco`][optax_q.eco] computed and
  quantized, in the same layout. So is a bf16 parameter of
  [`optax_q.split_weights`][optax_q.split_weights], whose update is its new
  value bit for bit. Other plain parameters take ``optax.apply_updates``'s
  ``p + u`` in the parameter's dtype; a tree without
  [`QArray`][optax_q.QArray]s or new weights is passed to
  ``optax.apply_updates`` whole.

  Args:
    params: The parameters.
    updates: Updates of the same structure (from [`optax_q.eco`][optax_q.eco]
      or [`optax_q.split_weights`][optax_q.split_weights]).

  Returns:
    The new parameters.

  Raises:
    ValueError: if ``updates`` does not have the structure of ``params``,
      or gives a quantized parameter a plain array (or a plain one a
      [`QArray`][optax_q.QArray], or another layout).

  Examples:
    >>> import jax.numpy as jnp, optax, optax_q
    >>> params = optax_q.quantize_params({'kernel': jnp.ones((2, 4))}, 'bf16')
    >>> tx = optax_q.eco(optax.inject_hyperparams(optax.sgd)(
    ...     0.5, momentum=0.9), rounding='nearest')
    >>> state = tx.init(params)
    >>> grads = {'kernel': jnp.ones((2, 4))}
    >>> updates, state = tx.update(grads, state, params)
    >>> optax_q.dequantize_params(optax_q.apply_updates(params, updates))[
    ...     'kernel'][0]
    Array([0.5, 0.5, 0.5, 0.5], dtype=float32)
  """
  p_def = jax.tree.structure(params, is_leaf=qarray_lib.is_qarray)
  u_def = jax.tree.structure(
      updates, is_leaf=lambda x: qarray_lib.is_qarray(x) or is_new_weights(x))
  if p_def != u_def:
    raise ValueError(
        'updates must have the structure of params (with QArray leaves '
        f'where params has them); params: {p_def}, updates: {u_def}.')
  flat_p = jax.tree_util.tree_flatten_with_path(
      params, is_leaf=qarray_lib.is_qarray)[0]
  # None leaves are empty nodes in both trees, as in flat_p.
  flat_u = jax.tree.leaves(
      updates, is_leaf=lambda x: qarray_lib.is_qarray(x) or is_new_weights(x))
  if not any(qarray_lib.is_qarray(p) for _, p in flat_p) and not any(
      is_new_weights(u) for u in flat_u):
    return optax.apply_updates(params, updates)
  out = []
  for (path, p), u in zip(flat_p, flat_u):
    where = state_tree.path_str(path)
    if is_new_weights(u):  # Checked against the parameter's kind.
      out.append(u.weights(p, where))
    elif qarray_lib.is_qarray(p):
      raise ValueError(
          f'updates[{where!r}] is a plain array, not new weights, but the '
          f'parameter is quantized ({qarray_lib.layout_tag(p)}): quantized '
          'parameters take the new weights that optax_q.eco returns '
          '(wrap the optimizer in optax_q.eco).')
    elif qarray_lib.is_qarray(u):
      raise ValueError(
          f'updates[{where!r}] holds new quantized weights but the '
          'parameter is a plain array.')
    elif p is None:
      out.append(None)
    else:
      out.append(jnp.asarray(p + u).astype(jnp.asarray(p).dtype))
  return p_def.unflatten(out)


@jax.custom_vjp
def _straight_through(x: jax.Array, y: jax.Array) -> jax.Array:
  """``y``, with the gradient passed to ``x`` unchanged (none to ``y``)."""
  del x
  return y


_straight_through.defvjp(lambda x, y: (y, None), lambda _, g: (g, None))


def fake_quantize_params(
    params: Any,
    fmt: str | formats_lib.Format = 'fp8_e4m3',
    *,
    scale_mode: str | None = None,
    block_size: int = 128,
    filter: Filter = None,  # pylint: disable=redefined-builtin
    rounding: str = 'nearest',
    seed: int | jax.Array = 0,
    step: int | jax.Array = 0,
) -> Any:
  r"""The weights a forward pass sees with float32 master weights.

  Each chosen leaf is quantized to ``fmt`` and decoded (the same codec as
  [`quantize_params`][optax_q.quantize_params]); the gradient passes straight
  through to the float32 leaf, so the optimizer updates the master weights with
  the gradient taken at the quantized ones (the "with master weights" baselines
  of the ECO paper, and quantization-aware training of the weights). The
  rounding is computed in the codec's explicit arithmetic, so ``jit``
  cannot elide it. For a loss `f` and a chosen leaf `w`:

  ```tex
  \bar w = D(Q(w)), \qquad
  \frac{\partial f(\bar w)}{\partial w} = \nabla f(\bar w),
  ```

  with `Q` and `D` as in [`quantize_params`][optax_q.quantize_params] (the
  scales of `w` itself; stochastic rounding draws its bits from ``seed``,
  ``step`` and the leaf), the Jacobian of the rounding taken as the
  identity.

  Args:
    params: Float parameters (the master weights).
    fmt: Any core format.
    scale_mode: As for [`quantize_params`][optax_q.quantize_params] (None:
      ``'row'`` for scaled formats).
    block_size: Elements per scale for block scales.
    filter: As for [`quantize_params`][optax_q.quantize_params].
    rounding: ``'nearest'`` or ``'stochastic'``.
    seed: Seed of the stochastic rounding (an int, or a traced integer
      scalar).
    step: Mixed into the stochastic rounding bits (may be traced), so
      every step draws new bits.

  Returns:
    Float parameters, the chosen leaves on ``fmt``'s grid.

  Examples:
    >>> import jax, jax.numpy as jnp, optax_q
    >>> w = {'kernel': jnp.array([[0.3, 1.0]])}
    >>> optax_q.fake_quantize_params(w, 'int4')['kernel']
    Array([[0.2857143, 1.       ]], dtype=float32)
    >>> jax.grad(lambda w: optax_q.fake_quantize_params(w, 'int4')[
    ...     'kernel'].sum())(w)['kernel']
    Array([[1., 1.]], dtype=float32)

  References:
    Nikdan et al, [ECO: Quantized Training without Full-Precision Master
    Weights](https://arxiv.org/abs/2601.22101), 2026
  """
  fmt, scale_mode, block_size = _weight_layout(
      fmt, scale_mode, block_size, rounding)
  seed = validation.check_seed(seed, traced=True)
  step = validation.check_int(step, 'step', high=formats_lib.UINT32_MAX,
                               traced=True)

  def fake(index, path, leaf):
    del path
    key = (param_key(seed, step, index) if rounding == 'stochastic'
           else None)
    rounded = qarray_lib.round_trip(
        jax.lax.stop_gradient(leaf), fmt, scale_mode=scale_mode,
        block_size=block_size, key=key)
    return _straight_through(leaf, rounded)

  return map_chosen(params, filter, fake)

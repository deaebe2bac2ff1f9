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
"""``quantize_state``: any Optax transform with low-precision state.

The wrapper keeps the inner transform's state as `QArray` leaves.
Every ``update`` decodes the state, runs the inner update in float32,
returns the updates computed from the float32 moments, and encodes the new
state for storage (error enters only at write-back). Which leaves are
quantized, and how, is decided at ``init`` from static information only
(field names, global shapes), so the jitted step is one compiled function.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
import dataclasses
import functools
import math
from typing import Any, NamedTuple, Union

import jax
import jax.extend as jex
import jax.numpy as jnp
import numpy as np
import optax

from optax_q._src.codec import codec as codec_lib
from optax_q._src.codec import formats as formats_lib
from optax_q._src.codec import qarray as qarray_lib
from optax_q._src.codec import rounding as rounding_lib
from optax_q._src.core import explicit
from optax_q._src.core import validation
from optax_q._src.execution import kernels
from optax_q._src.state import leafwise
from optax_q._src.state import state_tree

Format = formats_lib.Format
QArray = qarray_lib.QArray

FormatSpec = Union[
    str, Format, Mapping[str, Union[str, Format, None]],
    Callable[[str, jax.Array], Union[str, Format, None]], None]

NONNEGATIVE_FIELDS = frozenset({
    'nu', 'nu_max', 'v', 'sum_of_squares', 'grad_sum_of_squares', 'nu_hat',
    'exp_avg_sq', 'acc', 'e_g', 'e_x', 'v_row', 'v_col',
})
"""The names of the state fields that hold non-negative statistics (second
moments), a frozenset of strings.

It is the default of the ``nonnegative_fields`` argument of
[`quantize_state`][optax_q.quantize_state] (and of the optimizers built on
it). On these fields a format is replaced by its
[`unsigned_variant`][optax_q.unsigned_variant] (``int8_dynamic`` becomes
the unsigned dynamic map, ``int4`` and ``fp4_e2m1`` grids without zero),
and only there is an unsigned format such as ``'fp4_e2m2u'`` accepted. For
an optimizer whose non-negative statistics have other names, pass those
names as ``nonnegative_fields`` (the fields of its state, which replace
this default).
"""

DEFAULT_SEED = 0
DEFAULT_MIN_SIZE = 4096
DEFAULT_BLOCK_SIZE = 128
DEFAULT_TILE_SIZE = 2**18

# Re-exported: the walkers of state trees live in ``state_tree``.
path_str = state_tree.path_str
field_name = state_tree.field_name
probe_state = state_tree.probe_state
check_known_fields = validation.check_known


class QuantizedState(NamedTuple):
  """State of [`quantize_state`][optax_q.quantize_state].

  Attributes:
    count: Steps taken (int32); mixed into the stochastic-rounding bits.
    inner_state: The inner transform's state, with quantized leaves held as
      [`QArray`][optax_q.QArray].
    stalled: Same structure as ``inner_state`` with a float32 scalar per
      quantized leaf (the fraction of elements whose stored code did not
      change in the last step; read with ``optax_q.stall_fraction``) and
      ``None`` elsewhere.
  """

  count: jax.Array
  inner_state: optax.OptState
  stalled: Any


def _check_formats(formats: FormatSpec, nonnegative: frozenset[str]
                   ) -> FormatSpec:
  """Resolves format names early (a ValueError names the bad argument)."""
  if formats is None or callable(formats) and not isinstance(formats, Format):
    return formats
  if isinstance(formats, (str, Format)):
    return formats_lib.check_format(formats, 'formats')

  def check(key, fmt):
    fmt = (None if fmt is None
           else formats_lib.check_format(fmt, f'formats[{key!r}]'))
    if fmt is not None and not fmt.signed and key not in nonnegative:
      raise ValueError(
          f'formats[{key!r}]={fmt.name!r} is unsigned, but {key!r} is a '
          'signed state field; unsigned formats are allowed for '
          f'{sorted(nonnegative)}.')
    return fmt

  return validation.check_field_map(
      formats, 'formats', check,
      'a format name, a Format, a dict {field: format} or a callable '
      '(path, leaf) -> format')


def check_storage_args(*, rounding: Any, block_size: Any, seed: Any,
                       min_size: Any) -> tuple[Any, int, Any, int]:
  """Checks the storage arguments of `quantize_state`.

  Returns ``(rounding, block_size, seed, min_size)``; None stands for the
  default, the numbers become Python ints (a seed may be a scalar integer
  ``jax.Array``, as ``optax.inject_hyperparams`` injects it); a ValueError
  names the bad argument and the allowed values.
  """
  modes = validation.STATE_ROUNDING_MODES
  if isinstance(rounding, Mapping):
    rounding = validation.check_field_map(
        rounding, 'rounding', lambda key, mode: validation.check_rounding(
            mode, f'rounding[{key!r}]', modes=modes), 'a dict')
  else:
    rounding = validation.check_rounding(rounding, modes=modes)
  hint = validation.STATIC_HINT
  return (
      rounding,
      validation.check_block_size(
          DEFAULT_BLOCK_SIZE if block_size is None else block_size),
      validation.check_seed(DEFAULT_SEED if seed is None else seed,
                            traced=True),
      validation.check_int(DEFAULT_MIN_SIZE if min_size is None else min_size,
                           'min_size', hint=hint))


def _check_preconditioner(preconditioner: Any, rounding: Any
                          ) -> dict[str, float]:
  """``{field: eps}``, checked against the fields ``rounding`` sends to
  preconditioner space."""
  if preconditioner is None:
    preconditioner = {}
  if not isinstance(preconditioner, Mapping):
    raise ValueError(
        f'preconditioner={validation.short(preconditioner)}: a dict '
        "{field: eps} such as {'nu': 1e-8}, or None.")
  wanted = ([f for f, r in rounding.items() if r == 'preconditioner']
            if isinstance(rounding, Mapping) else
            [None] if rounding == 'preconditioner' else [])
  validation.check_field_keys(preconditioner, 'preconditioner')
  checked = {}
  for field, eps in preconditioner.items():
    if isinstance(eps, jax.core.Tracer) and not (
        field in wanted or None in wanted):
      continue  # Declared and unused: a traced eps may stay traced.
    checked[field] = validation.check_number(
        eps, f'preconditioner[{field!r}]', concrete=True,
        hint=" rounding='preconditioner' stores it in the format: under "
        "optax.inject_hyperparams, list 'eps' in static_args.")
  missing = [f for f in wanted if f is not None and f not in checked]
  if missing or (None in wanted and not checked):
    raise ValueError(
        f"rounding='preconditioner' for {missing or 'every field'}: this "
        'rounding is for state fields the optimizer uses through Adam\'s map '
        "1/(sqrt(v) + eps), declared with their eps (preconditioner={'nu': "
        "eps} in quantize_state; adamw, adam, shampoo and soap declare their "
        "second moment, the only such field). Other fields, and lion, sgd, "
        "muon and adaptive_bits, declare none: use 'stochastic'.")
  return checked


def leaf_rounding(rounding: str | Mapping[str, str],
                  field: str | None) -> str:
  """The rounding of a leaf of ``field`` (unlisted fields: stochastic)."""
  if isinstance(rounding, Mapping):
    return rounding.get(field, 'stochastic')
  return rounding


@dataclasses.dataclass(frozen=True)
class StorageConfig:
  """How [`quantize_state`][optax_q.quantize_state] stores a state; checked when
  made.

  Every argument is checked and canonicalised on construction (a
  ``ValueError`` names the bad one); see
  [`quantize_state`][optax_q.quantize_state] for their meaning. ``None`` stands
  for the default of ``seed`` (0), ``min_size`` (4096) and ``block_size`` (128),
  so that ``optax.inject_hyperparams``, which injects every int it is given,
  leaves the defaults static.

  Attributes:
    formats: One format, ``{field: format}``, or ``(path, leaf) -> format``.
    rounding: ``'nearest'``, ``'stochastic'``, ``'preconditioner'`` or
      ``{field: rounding}``.
    seed: Seed of the stochastic rounding.
    min_size: Leaves with fewer elements stay unquantized.
    block_size: Elements per scale along the last axis.
    scale_mode: ``'block'``, ``'block_pow2'``, ``'row'``, ``'tensor'``,
      ``'none'`` or None (by format).
    track_stalls: Whether the state keeps per-leaf stalled fractions.
    elementwise: Whether the inner transform is elementwise (see
      [`quantize_state`][optax_q.quantize_state]).
    tile_size: Most elements per tile, or None.
    kernel: How tiled leaves are updated: ``'auto'``, ``'xla'`` or
      ``'pallas'`` (see [`quantize_state`][optax_q.quantize_state]).
    nonnegative_fields: Fields holding non-negative statistics.
    preconditioner: ``{field: eps}``: the fields the inner transform uses
      through Adam's map ``1/(sqrt(v) + eps)``, with their ``eps``, for
      ``rounding='preconditioner'`` (see
      [`in_preconditioner_space`][optax_q.in_preconditioner_space]).

  Examples:
    >>> import optax_q
    >>> optax_q.StorageConfig(formats='fp8', block_size=64).block_size
    64
  """

  formats: FormatSpec = 'int8_dynamic'
  rounding: str | Mapping[str, str] = 'stochastic'
  seed: Any = None
  min_size: Any = None
  block_size: Any = None
  scale_mode: str | None = None
  track_stalls: bool = True
  elementwise: bool = False
  tile_size: int | None = DEFAULT_TILE_SIZE
  nonnegative_fields: frozenset[str] = NONNEGATIVE_FIELDS
  kernel: str = 'auto'
  preconditioner: Mapping[str, float] | None = None

  def __post_init__(self):
    nonnegative = frozenset(validation.check_names(
        self.nonnegative_fields, 'nonnegative_fields'))
    rounding, block_size, seed, min_size = check_storage_args(
        rounding=self.rounding, block_size=self.block_size, seed=self.seed,
        min_size=self.min_size)
    tile_size = self.tile_size
    if tile_size is not None:
      tile_size = validation.check_int(
          tile_size, 'tile_size', low=1, what='a positive int or None')
    checked = dict(
        nonnegative_fields=nonnegative, rounding=rounding,
        block_size=block_size, seed=seed, min_size=min_size,
        formats=_check_formats(self.formats, nonnegative),
        scale_mode=None if self.scale_mode is None else
        validation.check_scale_map(self.scale_mode),
        track_stalls=validation.check_bool(self.track_stalls, 'track_stalls'),
        elementwise=validation.check_bool(self.elementwise, 'elementwise'),
        tile_size=tile_size,
        kernel=validation.check_choice(self.kernel, 'kernel',
                                       kernels.KERNELS))
    checked['preconditioner'] = _check_preconditioner(
        self.preconditioner, rounding)
    if checked['kernel'] == 'pallas' and checked['track_stalls']:
      raise ValueError(
          "kernel='pallas' does not count stalled codes: pass "
          "track_stalls=False, or kernel='auto' or 'xla'.")
    if checked['kernel'] == 'pallas' and not checked['elementwise']:
      raise ValueError(
          "kernel='pallas' runs the tiles of the per-parameter path: pass "
          "elementwise=True (for an elementwise inner transform), or "
          "kernel='auto' or 'xla'.")
    # A format known now must take its scale mode (those a callable gives
    # are checked leaf by leaf at ``init``).
    formats, scale_mode = checked['formats'], checked['scale_mode']
    if scale_mode is not None and formats is not None and (
        isinstance(formats, Format) or not callable(formats)):
      fields = formats if isinstance(formats, Mapping) else (
          scale_mode if isinstance(scale_mode, Mapping) else {None: None})
      for field in fields:
        fmt = formats.get(field) if isinstance(formats, Mapping) else formats
        mode = (scale_mode.get(field) if isinstance(scale_mode, Mapping)
                else scale_mode)
        if fmt is not None and mode is not None:
          name = 'scale_mode' if field is None else f'scale_mode[{field!r}]'
          qarray_lib.check_layout(fmt, mode, name)
    for name, value in checked.items():
      object.__setattr__(self, name, value)
    # A format known now must round in its field's space (those a callable
    # gives are checked leaf by leaf at ``init``).
    for field in self.preconditioner:
      fmt = (self.formats.get(field) if isinstance(self.formats, Mapping)
             else self.formats if isinstance(self.formats, Format) else None)
      if fmt is not None:
        self.in_rounding_space(field, fmt)

  def check_fields(self, inner: optax.GradientTransformation) -> None:
    """Raises if ``formats``, ``rounding`` or declared ``nonnegative_fields``
    name fields ``inner``'s state lacks."""
    named = [(arg, value) for arg, value in
             (('formats', self.formats), ('rounding', self.rounding),
              ('scale_mode', self.scale_mode))
             if isinstance(value, Mapping)]
    if self.nonnegative_fields != NONNEGATIVE_FIELDS:
      named.append(('nonnegative_fields', self.nonnegative_fields))
    if self.preconditioner:
      named.append(('preconditioner', self.preconditioner))
    if not named:
      return
    names = state_tree.probe_field_names(inner)
    known = None if names is None else names[0]
    for arg, value in named:
      validation.check_known(arg, value, known, 'float')

  def rounding_for(self, field: str | None) -> str:
    rounding = leaf_rounding(self.rounding, field)
    if rounding == 'preconditioner' and field not in self.preconditioner:
      return 'stochastic'  # A field used linearly (Adam's first moment).
    return rounding

  def codec_for(self, path, leaf, fmt: Format, root=None) -> codec_lib.Codec:
    """The codec of one state leaf stored in ``fmt``.

    A scale mode per field where ``scale_mode`` is a mapping (unlisted
    fields: by format); see `Codec.for_leaf` for the fallbacks.
    """
    mode = self.scale_mode
    if isinstance(mode, Mapping):
      mode = mode.get(state_tree.field_name(path, root))
    return codec_lib.Codec.for_leaf(fmt, mode, self.block_size, leaf.shape)

  def key_for(self, count: jax.Array, index: int, field: str | None):
    """The stochastic-rounding key of the leaf at flat ``index``, or None."""
    if self.rounding_for(field) == 'nearest':
      return None
    return rounding_lib.stream_key(self.seed, count, index)

  def in_rounding_space(self, field: str, fmt: Format) -> Format:
    """``fmt`` for ``field`` rounded in Adam's preconditioner space where
    ``rounding`` says so (a float32 field has nothing to round)."""
    if fmt.is_identity or self.rounding_for(field) != 'preconditioner':
      return fmt
    try:
      return formats_lib.in_preconditioner_space(
          fmt, self.preconditioner[field])
    except ValueError as e:
      raise ValueError(
          f"rounding='preconditioner' for state field {field!r}: {e}"
      ) from None

  def format_for(self, path, leaf, root=None) -> Format | None:
    """The format of one state leaf, or None to keep it as it is."""
    name = state_tree.field_name(path, root)
    if self.formats is None:
      return None
    if isinstance(self.formats, Format):
      fmt = self.formats
    elif isinstance(self.formats, Mapping):
      fmt = self.formats.get(name)
    else:
      fmt = self.formats(path_str(path), leaf)
      fmt = None if fmt is None else formats_lib.get_format(fmt)
    if fmt is None:
      return None
    if self.rounding_for(name) == 'preconditioner':
      return self.in_rounding_space(name, fmt)
    if name in self.nonnegative_fields:
      return formats_lib.unsigned_variant(fmt)
    if not fmt.signed:
      raise ValueError(
          f'format {fmt.name!r} is unsigned but state leaf '
          f'{path_str(path)!r} may be negative; use a signed format there.')
    return fmt


def plan_leaf(config: StorageConfig, path, leaf, root,
              zero: bool = False) -> Any:
  """One leaf of the inner state as it is stored: a `QArray` or as is.

  Float leaves of at least ``min_size`` elements whose format is not
  ``fp32`` are encoded, unless the codes and scales would take as many
  bytes as the leaf. A leaf known to be zeros (``zero``) takes the codes
  and scales of zero (`qarray.zeros`), sharded as its encoding would be,
  with nothing compiled. A box (``nnx.Variable``) around a leaf goes
  around its codes and around its scales, never around the QArray: they
  have the param's rank, and Flax NNX's ``nnx.update`` would turn a QArray
  held in a Variable into a plain State.
  """
  box = None
  if state_tree.is_box(leaf):  # e.g. an nnx.Variable: quantize what it holds
    box, leaf = leaf, jax.tree.leaves(leaf)[0]
    path = (*path, jax.tree_util.GetAttrKey('value'))
  if (not state_tree.is_float_array(leaf)
      or leaf.size < max(config.min_size, 1)):
    return leaf if box is None else box
  fmt = config.format_for(path, leaf, root)
  if fmt is None or fmt.is_identity:
    return leaf if box is None else box
  codec = config.codec_for(path, leaf, fmt, root)
  # A concrete leaf across several devices is encoded even when zero: its
  # encoding outside ``jit`` is sharded as the compiler propagates the
  # leaf's sharding through the encoder (where blocks or packed bytes don't
  # divide, not as `state_shardings` lays it out).
  spread = False
  if zero and not isinstance(leaf, jax.core.Tracer):
    sharding = getattr(leaf, 'sharding', None)
    spread = sharding is not None and len(sharding.device_set) > 1
  if zero and not spread:
    # On a mesh with Explicit axes, the buffers are sharded as
    # `state_shardings` lays out the sharding in the leaf's type (the
    # shardings its encoding gets there).
    type_sharding = explicit.type_sharding(leaf)
    shardings = (None, None)
    if type_sharding is not None:
      shardings = codec.shardings(tuple(leaf.shape), type_sharding)
    q = codec.zeros(leaf.shape, leaf.dtype, codes_sharding=shardings[0],
                    scale_sharding=shardings[1])
  else:
    q = codec.encode_compiled(leaf, key=None)
  if not fmt.simulated and q.nbytes >= qarray_lib.nbytes_of(leaf):
    # Blocks along a very short last axis (a (n, 1) kernel has one scale
    # per element): the "quantized" leaf would be bigger. Keep it. A
    # simulated grid (e5m10 in a float32 container) is kept for its
    # rounding, whatever its bytes.
    return leaf if box is None else box
  if box is None:
    return q
  return dataclasses.replace(
      q, codes=state_tree.rebox(box, q.codes),
      scale=None if q.scale is None else state_tree.rebox(box, q.scale))


def _is_zero(v, zeros: set[Any]) -> bool:
  if isinstance(v, jex.core.Literal):
    # All bytes zero: +0.0 (never -0.0, whose codes differ) or integer 0.
    return not np.asarray(v.val).reshape(-1).view(np.uint8).any()
  return v in zeros


# Primitives that keep a zero operand zero (``jnp.zeros`` and
# ``jnp.zeros_like`` trace to a broadcast of a literal zero).
_ZERO_KEEPING = ('broadcast_in_dim', 'convert_element_type', 'reshape',
                 'copy')


def zero_leaves(init: Callable[[Any], Any], params) -> Any:
  """A tree like ``init(params)``: True at each leaf that ``init`` sets to
  constant zeros, False elsewhere (or None where ``params`` has leaves
  that are not arrays).

  Read from ``init``'s trace (nothing runs): a leaf is zero when it is a
  broadcast, cast or reshape of a literal zero, as ``jnp.zeros`` and
  ``optax.tree.zeros_like`` give. Leaves computed otherwise (an identity
  matrix, a copy of the parameters) are not.
  """
  if not all(hasattr(x, 'dtype') for x in jax.tree.leaves(params)):
    return None
  closed, shapes = jax.make_jaxpr(init, return_shape=True)(params)
  zeros = set()
  for eqn in closed.jaxpr.eqns:
    if (eqn.primitive.name in _ZERO_KEEPING
        and _is_zero(eqn.invars[0], zeros)):
      zeros.update(eqn.outvars)
  return jax.tree.unflatten(jax.tree.structure(shapes), [
      _is_zero(v, zeros) for v in closed.jaxpr.outvars])


def _init(config: StorageConfig, inner, params) -> QuantizedState:
  # Zeros take their codes and scales without an encoder compiled or run.
  zero = zero_leaves(inner.init, params)
  state = inner.init(params)
  if zero is None:
    zero = jax.tree.map(lambda _: False, state)
  qstate = jax.tree_util.tree_map_with_path(
      lambda path, leaf, z: plan_leaf(
          config, path, leaf, state,
          bool(jax.tree.leaves(z)) and all(jax.tree.leaves(z))),
      state, zero, is_leaf=state_tree.is_box)
  stalled = None
  if config.track_stalls:
    # The stalled fractions are telemetry, not a copy of the parameters:
    # where ``optax.tree_map_params`` passed its parameters placeholder,
    # one scalar stands in for it, so that they are mapped as the other
    # non-parameters are (their ``None`` holes match no parameter tree).
    stalled = jax.tree.map(
        lambda x: jnp.zeros([], jnp.float32)
        if _is_params_placeholder(x) else x,
        _stall_tree(qstate, None), is_leaf=_is_params_placeholder)
  return QuantizedState(
      count=jnp.zeros([], jnp.int32), inner_state=qstate, stalled=stalled)


def _update(config: StorageConfig, inner, updates, state, params=None,
            **extra_args):
  inner_update = optax.with_extra_args_support(inner).update
  # The stored state flattened with QArrays as leaves, and the leaves' fields
  # (which set their rounding).
  old = state.inner_state
  flat = jax.tree_util.tree_flatten_with_path(
      old, is_leaf=qarray_lib.is_qarray)[0]
  flat_old = [x for _, x in flat]
  treedef = jax.tree.structure(old, is_leaf=qarray_lib.is_qarray)
  fields = [state_tree.field_name(path, old) for path, _ in flat]

  def rounding_for(index: int) -> str:
    return config.rounding_for(fields[index])

  def key_for(index: int) -> jax.Array | None:
    return config.key_for(state.count, index, fields[index])

  result = None
  if config.elementwise:
    # The per-parameter path (see ``leafwise``), or None where it can't go.
    result = leafwise.update(
        inner_update, updates, treedef.unflatten(flat_old), params,
        extra_args, key_for=key_for, rounding_for=rounding_for,
        tile_size=config.tile_size, track_stalls=config.track_stalls,
        kernel=config.kernel)
  if result is not None:
    new_updates, new_qstate, stall_at = result
    stalled = None
    if config.track_stalls:
      stalled = treedef.unflatten([
          stall_at[i] if qarray_lib.is_qarray(o) else None
          for i, o in enumerate(flat_old)])
  else:
    # The whole tree: decode every leaf, one inner update, encode.
    decoded = treedef.unflatten([
        leafwise.decode_for_inner(o, rounding_for(i))
        for i, o in enumerate(flat_old)])
    new_updates, new_inner = inner_update(
        updates, decoded, params, **extra_args)
    flat_new = treedef.flatten_up_to(new_inner)
    new_qstate = treedef.unflatten([
        qarray_lib.encode_like(o, n, key=key_for(i))
        if qarray_lib.is_qarray(o) else n
        for i, (o, n) in enumerate(zip(flat_old, flat_new))])
    stalled = (_stall_tree(new_qstate, treedef.unflatten(flat_old))
               if config.track_stalls else None)
  # Updates take the gradients' dtypes. Where the inner transform returns
  # a pytree in place of a gradient's array (the new weights
  # ``optax_q.eco`` gives quantized parameters), it is kept as it is.
  new_updates = jax.tree.map(
      lambda o, n: n if n is None or not hasattr(n, 'dtype')
      else optax.tree.cast_like(n, o), updates, new_updates,
      is_leaf=lambda x: x is None)
  return new_updates, QuantizedState(
      count=optax.safe_increment(state.count), inner_state=new_qstate,
      stalled=stalled)


def quantize_state(
    inner: optax.GradientTransformation,
    formats: FormatSpec = 'int8_dynamic',
    *,
    rounding: str | Mapping[str, str] = 'stochastic',
    seed: int | None = None,
    min_size: int | None = None,
    block_size: int | None = None,
    scale_mode: str | None = None,
    track_stalls: bool = True,
    elementwise: bool = False,
    tile_size: int | None = DEFAULT_TILE_SIZE,
    nonnegative_fields: Sequence[str] = NONNEGATIVE_FIELDS,
    scale: str | None = None,
    kernel: str = 'auto',
    preconditioner: Mapping[str, float] | None = None,
) -> optax.GradientTransformationExtraArgs:
  r"""Keeps the state of ``inner`` in low-precision formats.

  ``update`` decodes the stored state to float32, runs ``inner.update``,
  returns the updates it computed from the float32 state, and encodes the
  new state for storage with the chosen rounding. With block scales, a
  state leaf `x` in a format whose grid `G` has largest value `g_{\max}` is
  stored, per block `b` of ``block_size`` elements along its last axis, as
  one scale and one code per element:

  ```tex
  s_b = \frac{\max_{i \in b} |x_i|}{g_{\max}}, \qquad
  c_i = R_G\!\left(\frac{x_i}{s_b}\right), \qquad
  \hat x_i = s_b\, c_i.
  ```

  `R_G` rounds to the nearest value of `G` (ties to even), or
  stochastically to one of the two neighbours `g_- \le y \le g_+` with
  `P(g_+) = (y - g_-)/(g_+ - g_-)`, so that `E[\hat x_i] = x_i`. A step is
  then `(u_t, x_t) = \mathrm{inner}(g_t, \hat x_{t-1})` and
  `\hat x_t = Q(x_t)`: the update comes from the decoded state, in float32.
  Which leaves are
  quantized is decided once, at ``init``: float leaves of the inner state
  that have at least ``min_size`` elements (counted on the global shape, so
  sharding does not change the decision), a format other than ``fp32``, and
  whose codes and scales take fewer bytes than the leaf (not so for block
  scales along a last axis of one or two elements).
  Everything else (counters, small leaves, biases and norms of small models)
  is kept as the inner transform made it.

  Non-negative fields (second moments: ``nu``, ``sum_of_squares``, ... see
  ``NONNEGATIVE_FIELDS``, or the fields given as ``nonnegative_fields``)
  use the unsigned variant of a codebook format (``int8_dynamic`` becomes
  the unsigned dynamic map, as in bitsandbytes); an unsigned format such as
  ``fp4_e2m2u`` is rejected on a signed field.

  Args:
    inner: Any Optax gradient transformation.
    formats: One format for every quantizable leaf (a name or
      [`Format`][optax_q.Format]), a dict ``{field: format}`` keyed by the state
      field (``'mu'``, ``'nu'``, ``'trace'``, ...; unlisted fields stay as they
      are), or a callable ``(path, leaf) -> format or None`` where ``path``
      is the leaf's ``'a/b/c'`` name in the inner state.
    rounding: ``'nearest'`` (round half to even) or ``'stochastic'``
      (unbiased, from a counter-based hash of seed, step, leaf and element),
      or a dict ``{field: rounding}`` such as ``{'mu': 'nearest', 'nu':
      'stochastic'}`` (unlisted fields round stochastically).
      ``'preconditioner'`` rounds the fields declared in ``preconditioner``
      stochastically in the space of the map the inner transform applies to
      them (unbiased in Adam's ``1/(sqrt(v) + eps)``, not in ``v``: see
      [`in_preconditioner_space`][optax_q.in_preconditioner_space]; their
      formats must be codebooks), and every other field as
      ``'stochastic'``.
    seed: Seed of the stochastic rounding, an int in ``[0, 2**32 - 1]``
      (or a scalar integer array); None: 0.
    min_size: Leaves with fewer elements stay unquantized; None: 4096 (as
      bitsandbytes).
    block_size: Elements per scale along the last axis for block scaling,
      an even int in ``[2, 2**20]``; None: 128.
    scale_mode: ``'block'``, ``'block_pow2'``, ``'row'``, ``'tensor'``,
      ``'rank1'`` or ``'none'``, or a dict ``{field: scale mode}`` such as
      ``{'nu': 'rank1'}`` (unlisted fields: by format); the default is
      ``'block'`` for formats with a narrow range and ``'none'`` for
      ``bf16`` and ``fp16``. ``'block_pow2'`` stores each block's scale as
      a power of two in one byte (the OCP MX E8M0 scale: 4.06 bits per
      element for a 4-bit state at block 128 instead of 4.25); a block
      holding an infinity or a NaN then decodes to NaN. ``'rank1'`` scales
      each element of a matrix by the smaller of its row's and its column's
      absolute maximum (Li et al., 2023; an element of a tensor of rank p
      by the smallest of its p slices' maxima, one per axis); a
      leaf of rank < 2 falls back to ``'block'``, and a rank-1 leaf is
      updated whole, never in tiles.
    track_stalls: Keep the per-leaf stalled fraction of the last step in the
      state (one float32 scalar per quantized leaf).
    elementwise: Declares that ``inner`` is elementwise: each parameter's
      new state and update depend only on that parameter's gradient, state
      and value and on shared scalars (``scale_by_adam``, ``scale_by_lion``,
      ``trace``; not ``scale_by_adafactor`` or global-norm clipping). The
      update then runs one parameter at a time, large ones in tiles of
      rows, so that no float32 copy of the whole state is ever alive, and
      the update is left to fuse into ``apply_updates``; the new state is
      that of the whole-tree path, the updates agree with it to float32
      rounding. The drop-in
      optimizers set it. A state not laid out per parameter (or codes held
      in ``nnx.Variable`` boxes) takes the whole-tree path.
    tile_size: With ``elementwise``, the most elements per tile of a large
      parameter (whole rows along its first axis) where the step is
      lowered for CPU; None turns tiling off. Lowered for a GPU or TPU a
      parameter is updated in one fused call, whatever its size (its
      float32 temporaries are then the compiler's to bound).
    nonnegative_fields: The state fields that hold non-negative statistics
      (a sequence of names; ``NONNEGATIVE_FIELDS`` by default): declare a
      new optimizer's, such as preconditioner statistics, here.
    scale: Deprecated name of ``scale_mode``.
    preconditioner: ``{field: eps}``, the fields ``inner`` uses through
      Adam's map ``1/(sqrt(v) + eps)`` and their ``eps`` (e.g. ``{'nu':
      1e-8}`` for ``optax.scale_by_adam()``), for
      ``rounding='preconditioner'``; the drop-ins declare theirs.
    kernel: With ``elementwise``, how a tiled parameter's new state is
      made: ``'xla'``, a loop over its tiles that the compiler fuses;
      ``'pallas'``, one Pallas kernel per parameter that decodes, updates,
      takes the block maxima and encodes each tile in one pass (for
      matrices whose formats are one-byte float or integer grids with
      block scales that divide the rows, without range expansion: on a
      GPU, Triton programs of 4096 elements of whole rows, rows of a power
      of two; on a TPU, Mosaic, tiles of rows in multiples of (8, 128);
      the XLA path for the other leaves; interpreted where the step is
      lowered for CPU, for tests; not with ``track_stalls``); ``'auto'``
      (default), the kernel on a platform where its run is verified (none
      yet: the XLA path everywhere). Lowered for a GPU or TPU, the XLA
      path updates each parameter in one fused call, without tiles (the
      platform the step is lowered for decides, not the machine that
      traces it), taking the block scales from a second evaluation of the
      new state (`encode`'s ``scale_source``).
      Interpreted, the kernel's codes are the loop's bit for bit (tested;
      the performance page says where it lowers). A module exported for
      more than one platform at once cannot hold the compiled kernel, and
      exporting the Triton kernel needs
      ``jax.export.DisabledSafetyCheck.custom_call('__gpu$xla.gpu.triton')``.

  Returns:
    A gradient transformation whose state is a
      [`QuantizedState`][optax_q.QuantizedState].

  Raises:
    ValueError: at construction, naming the bad argument and the allowed
      values (see [`StorageConfig`][optax_q.StorageConfig]), or naming a field
      of ``formats`` or ``rounding`` that ``inner``'s state does not have.

  Examples:
    >>> import jax.numpy as jnp, optax, optax_q
    >>> tx = optax_q.quantize_state(optax.scale_by_adam(),
    ...                             formats={'mu': 'int8', 'nu': 'int8_dynamic'},
    ...                             min_size=0)
    >>> state = tx.init({'w': jnp.zeros((4, 256))})
    >>> optax_q.state_nbytes(state) < 2 * 4 * 4 * 256
    True

  References:
    Dettmers et al, [8-bit Optimizers via Block-wise
    Quantization](https://arxiv.org/abs/2110.02861), 2022

    Li et al, [Memory Efficient Optimizers with 4-bit
    States](https://arxiv.org/abs/2309.01507), 2023
  """
  validation.check_transform(inner)
  name, scale_mode = validation.renamed('scale', scale, 'scale_mode',
                                        scale_mode)
  if scale_mode is not None:
    validation.check_scale_map(scale_mode, name)
  config = StorageConfig(
      formats=formats, rounding=rounding, seed=seed, min_size=min_size,
      block_size=block_size, scale_mode=scale_mode, track_stalls=track_stalls,
      elementwise=elementwise, tile_size=tile_size,
      nonnegative_fields=nonnegative_fields, kernel=kernel,
      preconditioner=preconditioner)
  config.check_fields(inner)
  return optax.GradientTransformationExtraArgs(
      functools.partial(_init, config, inner),
      functools.partial(_update, config, inner))


def _is_params_placeholder(x) -> bool:
  """Whether ``x`` is what ``optax.tree_map_params`` passes for the params."""
  return type(x).__name__ == '_ParamsPlaceholder'


def _stall_tree(new, old):
  """Per-quantized-leaf stalled fractions (zeros at init), None elsewhere."""
  if old is None:
    return jax.tree.map(
        lambda x: jnp.zeros([], jnp.float32) if qarray_lib.is_qarray(x)
        else None, new, is_leaf=qarray_lib.is_qarray)
  return jax.tree.map(
      lambda n, o: leafwise.stall(o, n) if qarray_lib.is_qarray(n) else None,
      new, old, is_leaf=qarray_lib.is_qarray)


def quantized_leaves(state: Any) -> dict[str, QArray]:
  """All [`QArray`][optax_q.QArray] leaves of any state, by ``'a/b/c'`` path.

  Args:
    state: Any optimizer state (or pytree).

  Returns:
    ``{path: QArray}``, in the state's flattening order.

  Examples:
    >>> import jax.numpy as jnp, optax_q
    >>> state = optax_q.adamw(1e-3, min_size=0).init({'w': jnp.ones((2, 256))})
    >>> sorted(optax_q.quantized_leaves(state))
    ['0/inner_state/mu/w', '0/inner_state/nu/w']
  """
  flat = jax.tree_util.tree_flatten_with_path(
      state, is_leaf=qarray_lib.is_qarray)[0]
  return {path_str(p): x for p, x in flat if qarray_lib.is_qarray(x)}

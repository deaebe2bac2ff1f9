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
"""State resets: restart stale EMA state on a schedule.

A moment kept in a low-precision grid stops moving once its increments fall
below the local grid spacing (it *stalls*), so it forgets far more slowly than
its nominal decay says. Resetting it to zero and bias-correcting by its local
age (steps since the last reset) restarts it like a fresh Adam moment.

* `reset_state` wraps any transform and zeroes chosen fields of its
  state (``'mu'``, ``'nu'``, a preconditioner statistic, ...) every ``K``
  steps, or when the measured staleness says so (``'adaptive'``). Quantized
  leaves (`QArray`) are overwritten with encoded zeros of the same
  dtype, shape and layout, so sharding and memory do not change. The
  decision is a ``jnp.where`` on int32 counters held in the state: one
  compiled step, and a resumed checkpoint repeats the run exactly.
* `scale_by_adam_local_age` is ``optax.scale_by_adam`` with one age per
  moment (``count_mu``, ``count_nu``), so that each moment is bias-corrected
  by the steps since *its own* last reset.
* `reset_where` is the tree surgery itself, for custom loops.

References:
  Topollai & Choromanska, [Understanding Quantization of Optimizer States in
  LLM Pre-training: Dynamics of State Staleness and Effectiveness of State
  Resets](https://arxiv.org/abs/2603.16731), 2026
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
import dataclasses
import functools
import math
import numbers
import reprlib
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

from optax_q._src.codec import formats as formats_lib
from optax_q._src.codec import qarray as qarray_lib
from optax_q._src.core import explicit
from optax_q._src.core import validation
from optax_q._src.resets import theory
from optax_q._src.state import state_tree
from optax_q._src.state import transform

QArray = qarray_lib.QArray

ADAPTIVE = 'adaptive'
AUTO = 'auto'
ADAM_MOMENTS = ('mu', 'nu')
RESET_VALUES = ('zeros', 'identity')
MAX_PERIOD = validation.MAX_PERIOD


# -----------------------------------------------------------------------------
# Tree surgery.
# -----------------------------------------------------------------------------


def _inner_of(x: Any):
  """For `state_tree.map_fields`: a quantized state is read through
  its inner state (its telemetry and rounding counter are not fields)."""
  if isinstance(x, transform.QuantizedState):
    return x.inner_state, lambda inner: x._replace(inner_state=inner)
  return None


def _map_fields(fn, names, state, *rest):
  """Maps ``fn(name, leaf, *rest_leaves)`` over ``state``'s leaves by field."""
  return state_tree.map_fields(fn, names, state, *rest, skip=_inner_of)


def _select(pred: jax.Array, x: Any) -> Any:
  """``x`` where not ``pred``; zeros where it is.

  A `QArray` becomes exact zeros in its own layout: the codes and scales of
  `qarray.zeros` (constants, not an encoding of zeros in the step), cast to
  the dtypes of ``x``'s codes and scales. Scaled formats get scale 0 (an
  all-zero block), which decodes to exact zeros even on grids without zero
  (``fp4_e2m2u``).
  """
  if qarray_lib.is_qarray(x):
    z = qarray_lib.zeros(x.shape, x.fmt, scale_mode=x.scale_mode,
                         block_size=x.block_size or 2, dtype=x.dtype)
    zeros = dataclasses.replace(
        z, codes=z.codes.astype(x.codes.dtype),
        scale=None if z.scale is None else z.scale.astype(x.scale.dtype))
    # Sharded as ``x`` (on Explicit axes a select needs equal shardings).
    return jax.tree.map(lambda z, v: jnp.where(pred, explicit.like(z, v), v),
                        zeros, x)
  if not hasattr(x, 'dtype'):
    return x
  return jnp.where(pred, jnp.zeros_like(x), x)


def _select_identity(pred: jax.Array, x: Any, weight: Any) -> Any:
  """``x`` where not ``pred``; where it is, the scaled identity a factor
  statistic is reset to (zero would leave its inverse root unbounded).

  Every trailing square matrix ``S`` becomes
  ``weight * max(mean(diag S), 0) * I``, stored as ``x`` is: cast to its
  dtype, or encoded in the layout of a `QArray`. A non-finite statistic
  (after a NaN gradient) restarts from zero.
  """
  if not (qarray_lib.is_qarray(x) or hasattr(x, 'dtype')):
    return x
  if len(x.shape) < 2 or x.shape[-1] != x.shape[-2]:
    raise ValueError(
        f"reset_to='identity' needs square matrices in its last two axes; "
        f'got a state leaf of shape {tuple(x.shape)}.')

  def reset(v):
    s = qarray_lib.decode(v) if qarray_lib.is_qarray(v) else v
    mean = jnp.mean(jnp.diagonal(s, axis1=-2, axis2=-1), axis=-1)
    finite = jnp.all(jnp.isfinite(s), axis=(-2, -1))
    mean = jnp.where(jnp.isfinite(mean) & finite, mean, 0.0)
    eye = jnp.broadcast_to(jnp.eye(s.shape[-1], dtype=jnp.float32), s.shape)
    identity = (weight * jnp.maximum(mean, 0.0))[..., None, None] * eye
    if not qarray_lib.is_qarray(v):
      return identity.astype(v.dtype)
    new = qarray_lib.encode_like(v, identity, key=None)
    return dataclasses.replace(
        new, codes=new.codes.astype(v.codes.dtype),
        scale=None if new.scale is None else new.scale.astype(v.scale.dtype))

  return jax.lax.cond(pred, reset, lambda v: v, x)


def reset_where(
    state: optax.OptState,
    where: Mapping[str, jax.typing.ArrayLike] | jax.typing.ArrayLike,
    fields: Sequence[str] = ADAM_MOMENTS,
) -> optax.OptState:
  r"""Zeroes the named fields of any optimizer state where a flag is set.

  Every array leaf under a state field named in ``fields`` (the innermost
  ``NamedTuple`` attribute on its path, e.g. ``'mu'`` of
  ``ScaleByAdamState``, at any depth: inside chains, ``optax.masked``,
  ``optax.partition`` and [`quantize_state`][optax_q.quantize_state]) is
  replaced by zeros when its flag is true: for each leaf `x` of a field `f`
  with flag `w_f`,

  ```tex
  x \leftarrow \begin{cases} 0 & \text{if } w_f, \\
    x & \text{otherwise.} \end{cases}
  ```

  Quantized leaves become encoded zeros with the same codes dtype, shape and
  scale layout. Flags may be traced: the selection is a ``jnp.where``, so this
  is safe under ``jit`` and never recompiles.

  Args:
    state: Any optimizer state.
    where: A boolean scalar for all ``fields``, or ``{field: flag}``.
    fields: State field names to zero (integer counters included, e.g.
      ``'count_nu'``): a sequence of strings, each a field of ``state``.

  Returns:
    The state with the same structure, dtypes and shapes.

  Raises:
    ValueError: if ``fields`` is a bare string or names a field ``state``
      does not have (the message lists those it has), if ``where`` names a
      field not in ``fields``, or if a flag is not a boolean scalar.

  Examples:
    >>> import jax.numpy as jnp, optax, optax_q
    >>> tx = optax.scale_by_adam()
    >>> state = tx.init({'w': jnp.ones(3)})
    >>> _, state = tx.update({'w': jnp.ones(3)}, state)
    >>> state = optax_q.reset_where(state, True, fields=('nu',))
    >>> state.nu['w']
    Array([0., 0., 0.], dtype=float32)

  References:
    Topollai & Choromanska, [Understanding Quantization of Optimizer States
    in LLM Pre-training: Dynamics of State Staleness and Effectiveness of
    State Resets](https://arxiv.org/abs/2603.16731), 2026 (Algorithm 1)
  """
  fields = validation.check_names(fields, 'fields')
  floats, ints = state_tree.field_names(state, skip=_inner_of)
  unknown = sorted(set(fields) - floats - ints)
  if unknown:
    raise ValueError(
        f'fields names state field(s) {unknown} that this state does not '
        f'have; its fields are {sorted(floats | ints)}.')
  if isinstance(where, Mapping):
    unknown = sorted(set(where) - set(fields), key=repr)
    if unknown:
      raise ValueError(
          f'where names field(s) {unknown} that are not in fields={fields}.')
    flags = {f: validation.check_flag(where.get(f, False), f'where[{f!r}]')
             for f in fields}
  else:
    flag = validation.check_flag(where, 'where')
    flags = {f: flag for f in fields}
  return _map_fields(
      lambda name, x: x if name is None else _select(flags[name], x),
      frozenset(fields), state)


# -----------------------------------------------------------------------------
# Argument checks.
# -----------------------------------------------------------------------------


def _check_unit(value: Any, name: str) -> Any:
  """A real number in the open interval (0, 1); jax.Arrays unchecked."""
  return validation.check_number(value, name, low=0.0, high=1.0, closed='()')


class _Plan(NamedTuple):
  """What `reset_state` resets, and how (checked at construction).

  Attributes:
    periods: ``{field: period or 'adaptive'}`` of the fields that are reset.
    counters: ``{counter field: [the fields it is zeroed with]}``.
    groups: Disjoint tuples of fields reset together.
    decay: `\\beta` of the adaptive rule.
    s0: Staleness tolerance of the adaptive rule.
    p_ss: Steady-state stall normaliser of the adaptive rule.
    reset_to: ``{field: 'identity'}`` of fields not reset to zero.
  """

  periods: dict[str, Any]
  counters: dict[str, list[str]]
  groups: tuple[tuple[str, ...], ...]
  decay: Any
  s0: Any
  p_ss: float
  reset_to: dict[str, str]

  @property
  def targets(self) -> frozenset[str]:
    return frozenset(self.periods) | frozenset(self.counters)


def _plan(every, name, *, fields, counters, groups, decay, s0, p_ss,
          reset_to=None) -> _Plan:
  """Checks `reset_state`'s arguments (not yet against the state)."""
  fields = validation.check_names(fields, 'fields')
  if isinstance(every, Mapping):
    named = validation.check_field_map(
        every, name,
        lambda f, p: validation.check_period(p, f'{name}[{f!r}]', (ADAPTIVE,)),
        'a dict')
  else:
    period = validation.check_period(every, name, (ADAPTIVE,))
    named = {f: period for f in fields}
  periods = {f: p for f, p in named.items() if p is not None}
  decay = _check_unit(decay, 'decay')
  s0 = _check_unit(s0, 's0')
  p_ss = validation.check_number(p_ss, 'p_ss', low=0.0, high=1.0,
                                 closed='(]', concrete=True)
  groups = validation.check_groups(groups, tuple(periods))

  # Counters: {field: counter field names} in, {counter: [fields]} out.
  def check_counters(f, cs):
    cs = (cs,) if isinstance(cs, str) else cs
    if not (isinstance(cs, Sequence) and all(isinstance(c, str) for c in cs)):
      raise ValueError(
          f'counters[{f!r}] must be an integer state field name (str) or a '
          f'sequence of them, e.g. {{{f!r}: {"count_" + f!r}}}; got '
          f'{validation.short(cs)}.')
    return tuple(cs)

  if counters is None:
    counters = {f: f'count_{f}' for f in periods}
  counters = validation.check_field_map(
      counters, 'counters', check_counters,
      'a dict {field: counter field name or a sequence of them}')
  unknown = sorted(set(counters) - set(named))
  if unknown:
    raise ValueError(
        f'counters names field(s) {unknown} that are not reset; the fields '
        f'to reset are {sorted(named)}.')
  counter_map: dict[str, list[str]] = {}
  for f, cs in counters.items():
    for c in cs if f in periods else ():
      counter_map.setdefault(c, []).append(f)

  # What each field is reset to: {field: 'identity'} ('zeros' is dropped).
  if reset_to is None:
    reset_to = {}
  else:
    reset_to = validation.check_field_map(
        reset_to, 'reset_to', lambda f, v: validation.check_choice(
            v, f'reset_to[{f!r}]', RESET_VALUES), 'a dict {field: value}')
    unknown = sorted(set(reset_to) - set(periods))
    if unknown:
      raise ValueError(
          f'reset_to names field(s) {unknown} that are not reset; the fields '
          f'to reset are {sorted(periods)}.')
    reset_to = {f: v for f, v in reset_to.items() if v != 'zeros'}
  return _Plan(periods, counter_map, groups, decay, s0, p_ss, reset_to)


def _check_plan(plan: _Plan, inner, counters_given: bool) -> None:
  """Checks the fields of ``plan`` against ``inner``'s (probed) state."""
  state = state_tree.probe_state(inner)
  if state is not None and plan.reset_to:
    bad = []

    def visit(name, leaf):
      shape = getattr(leaf, 'shape', None)
      if name in plan.reset_to and shape is not None and (
          len(shape) < 2 or shape[-1] != shape[-2]):
        bad.append((name, tuple(shape)))
      return leaf

    _map_fields(visit, frozenset(plan.reset_to), state)
    if bad:
      raise ValueError(
          f"reset_to[{bad[0][0]!r}]='identity' needs square matrices in the "
          f"last two axes (factor statistics); {bad[0][0]!r} has a leaf of "
          f'shape {bad[0][1]} on a probe tree.')
  names = state_tree.probe_field_names(inner, skip=_inner_of)
  if names is None:
    return
  floats, ints = names
  unknown = sorted(set(plan.periods) - floats)
  if unknown:
    raise ValueError(
        f'Unknown state field(s) {unknown} to reset; the state of this '
        f'transform has float fields {sorted(floats)}.')
  if counters_given:
    validation.check_known('counters', plan.counters, ints, 'integer')
    return
  ageless = sorted(f for f in plan.periods if f'count_{f}' not in ints)
  if ageless and 'count' in ints:
    validation.warn(
        f'Resetting {ageless} without an age counter: the inner state has '
        "no 'count_<field>' but a shared 'count'. If it bias-corrects by "
        'that count (as optax.scale_by_adam does), a reset moment is '
        "under-corrected; pass counters={field: 'count'} and reset the "
        'moments together, or use scale_by_adam_local_age.')


# -----------------------------------------------------------------------------
# The reset wrapper.
# -----------------------------------------------------------------------------


class ResetState(NamedTuple):
  """State of [`reset_state`][optax_q.reset_state].

  Attributes:
    count: Steps taken (int32).
    ages: ``{field: int32 scalar}``, updates since the field's last reset
      (its local age ``k``).
    excess: ``{field: float32 scalar}``, the accumulated excess staleness
      ``A`` of adaptive fields (0 for periodic ones).
    resets: ``{field: int32 scalar}``, resets so far (telemetry).
    inner_state: The wrapped transform's state.
  """

  count: jax.Array  # shape=(), dtype=jnp.int32.
  ages: dict[str, jax.Array]  # {field: shape=(), dtype=jnp.int32}.
  excess: dict[str, jax.Array]  # {field: shape=(), dtype=jnp.float32}.
  resets: dict[str, jax.Array]  # {field: shape=(), dtype=jnp.int32}.
  inner_state: optax.OptState


def _stalled_fraction(old, new, field: str) -> jax.Array:
  """`P_k`: the fraction of ``field``'s stored values that did not change.

  Pooled over all leaves of the field, weighted by their sizes. Quantized
  leaves compare their stored codes, as `optax_q.stall_fraction` does: with
  block scales that follow the block maximum, the scale moves a little almost
  every step even where the codes do not, and the codes are what staleness is
  about.
  """
  sums = []

  def visit(name, o, n):
    if name != field or not (qarray_lib.is_qarray(o) or hasattr(o, 'dtype')):
      return o
    size = o.size
    if size:
      unchanged = (qarray_lib.unchanged_count(o, n) if qarray_lib.is_qarray(o)
                   else jnp.sum(o == n, dtype=jnp.float32))
      sums.append((unchanged, size))
    return o

  _map_fields(visit, frozenset({field}), old, new)
  total = sum(s for _, s in sums)
  if not total:
    return jnp.zeros([], jnp.float32)
  return sum(x for x, _ in sums) / jnp.float32(total)


def reset_state(
    inner: optax.GradientTransformation,
    reset_every: int | str | Mapping[str, int | str | None] | None = None,
    *,
    fields: Sequence[str] = ADAM_MOMENTS,
    counters: Mapping[str, str | Sequence[str]] | None = None,
    groups: Sequence[Sequence[str]] = (),
    decay: float = 0.999,
    s0: float = 0.6,
    p_ss: float = 1.0,
    reset_to: Mapping[str, str] | None = None,
    every: Any = validation.UNSET,
) -> optax.GradientTransformationExtraArgs:
  r"""Resets chosen fields of ``inner``'s state on a schedule.

  Each update runs ``inner``, advances every field's local age ``k`` and,
  after the ``K``-th update since the field's last reset, sets the field to
  zero together with its age counters (Algorithm 1 of the paper): with
  `s_f` the field `f` of the inner state and `K_f` its period,

  ```tex
  (u_t, s) = \mathrm{inner}(g_t, s), \qquad k_f \leftarrow k_f + 1,
  \qquad \text{if } k_f \ge K_f: \quad s_f \leftarrow 0,\;
  k_f \leftarrow 0.
  ```

  The next update reads a zero state and bias-corrects with ``k = 1``, so the
  moment restarts like a fresh Adam moment. Parameters, the global step,
  learning rate schedules and stochastic-rounding counters are never reset.

  A field is any ``NamedTuple`` attribute of the inner state, at any depth
  (``'mu'``, ``'nu'``, ``'trace'``, preconditioner statistics). When
  ``inner`` is a [`quantize_state`][optax_q.quantize_state], quantized leaves
  are overwritten with encoded zeros (scale 0 for scaled formats, so grids
  without zero such as ``fp4_e2m2u`` still decode to exact zeros); codes keep
  their dtype, shape and sharding.

  ``'adaptive'`` fields follow Algorithm 2 of the paper: with
  `P_k` the fraction of the field's stored elements that did not change
  in the ``k``-th update (pooled over all its leaves; stored codes for
  quantized leaves, as [`optax_q.stall_fraction`][optax_q.stall_fraction] counts
  them),

  ```tex
  A \leftarrow A + \left[\frac{P_k / P_{ss} - s_0}{1 - s_0}\right]_+,
  \qquad \text{reset if } \frac{A}{k} \ge \frac{2\beta^k}{1 + \beta^k}.
  ```

  Fields in one of ``groups`` are reset together: when the rule of any of
  them fires, all of them (with their ages and accumulators) are reset. The
  drop-in optimizers group Adam's two moments whenever both have the same
  policy; resetting the second moment alone leaves an old first moment over
  a one-step second moment (see
  [`scale_by_adam_local_age`][optax_q.scale_by_adam_local_age], which bounds
  that update).

  Args:
    inner: The transform whose state is reset, typically a
      [`quantize_state`][optax_q.quantize_state] of
      [`scale_by_adam_local_age`][optax_q.scale_by_adam_local_age].
    reset_every: The reset period: an int ``K`` in ``[1, 2**31 - 1]`` for
      every field in ``fields``, ``'adaptive'``, ``None`` (never), or a dict
      ``{field: K | 'adaptive' | None}`` (fields not listed are never reset),
      e.g. ``{'nu': 300}`` for the paper's asymmetric FP8 policy.
    fields: Fields reset when ``reset_every`` is not a dict: a sequence of
      field names (not a bare string).
    counters: ``{field: counter field(s)}``: integer state fields zeroed
      together with the field (the ages its bias correction reads). By
      default ``count_<field>`` where the inner state has it (as in
      [`scale_by_adam_local_age`][optax_q.scale_by_adam_local_age]). For
      ``optax.scale_by_adam``, whose two moments share one ``count``, pass
      ``{'mu': 'count', 'nu': 'count'}`` and reset both moments together. Keys
      must be fields to reset.
    groups: Disjoint sequences of fields to reset together, e.g.
      ``(('mu', 'nu'),)``; each field must have a period or ``'adaptive'``.
      By default every field follows its own rule.
    decay: The EMA decay `\beta` in the statistical-error term of
      adaptive resets (the paper uses `\beta_2`), in ``(0, 1)``.
    s0: Staleness tolerance of adaptive resets, in ``(0, 1)``.
    p_ss: The steady-state stall normaliser `P_{ss}` of adaptive
      resets, in ``(0, 1]`` (the paper fixes 1).
    reset_to: ``{field: 'zeros' | 'identity'}``: what a reset field is
      set to (unlisted: ``'zeros'``). ``'identity'`` is for factor
      statistics of Shampoo and SOAP (square matrices in the last two
      axes), whose inverse root or power iteration zero would break: each
      matrix becomes `(1 - \beta)\,\overline{\mathrm{diag}}\, I`
      (``decay`` is `\beta`), a ridge worth one update of its mean
      eigenvalue, which the local-age bias correction then weighs like one
      of the gradients seen since the reset.
    every: Deprecated name of ``reset_every``.

  Returns:
    A gradient transformation whose state is a
      [`ResetState`][optax_q.ResetState].

  Raises:
    ValueError: at construction, naming the argument and the allowed values:
      for a period that is not an int in ``[1, 2**31 - 1]``, ``'adaptive'``
      or ``None``, for ``fields``, ``counters`` or ``groups`` of the wrong
      type or naming a field the inner state does not have, or for ``s0``,
      ``decay`` or ``p_ss`` out of range. Python and NumPy numbers are
      accepted alike.

  Examples:
    >>> import jax.numpy as jnp, optax, optax_q
    >>> inner = optax_q.quantize_state(
    ...     optax_q.scale_by_adam_local_age(), {'mu': 'fp8_e4m3',
    ...     'nu': 'fp8_e4m3'}, min_size=0)
    >>> tx = optax.chain(
    ...     optax_q.reset_state(inner, 'adaptive', groups=(('mu', 'nu'),)),
    ...     optax.scale(-1e-3))
    >>> state = tx.init({'w': jnp.zeros((4, 128))})
    >>> int(state[0].ages['nu'])
    0

  References:
    Topollai & Choromanska, [Understanding Quantization of Optimizer States
    in LLM Pre-training: Dynamics of State Staleness and Effectiveness of
    State Resets](https://arxiv.org/abs/2603.16731), 2026 (Algorithms 1, 2)

  See also [`reset_period`][optax_q.reset_period] and
  [`stall_fraction`][optax_q.stall_fraction].
  """
  validation.check_transform(inner)
  every_name, every = validation.renamed('every', every, 'reset_every',
                                         reset_every)
  plan = _plan(every, every_name, fields=fields, counters=counters, groups=groups,
               decay=decay, s0=s0, p_ss=p_ss, reset_to=reset_to)
  _check_plan(plan, inner, counters is not None)
  inner_ex = optax.with_extra_args_support(inner)
  reset_fields = sorted(plan.periods)

  def init_fn(params):
    zero_i = lambda: {f: jnp.zeros([], jnp.int32) for f in reset_fields}
    return ResetState(
        count=jnp.zeros([], jnp.int32), ages=zero_i(),
        excess={f: jnp.zeros([], jnp.float32) for f in reset_fields},
        resets=zero_i(), inner_state=inner_ex.init(params))

  def update_fn(updates, state, params=None, **extra_args):
    updates, new_inner = inner_ex.update(
        updates, state.inner_state, params, **extra_args)
    # Advance every field's age k and excess staleness A, and decide whether
    # it fires: a periodic field after its K-th update, an adaptive one when
    # A / k reaches the statistical error of its age (Algorithm 2). A group
    # fires when any of its fields does.
    ages, excess, flags = {}, {}, {}
    for f in reset_fields:
      k = optax.safe_increment(state.ages[f])
      a = state.excess[f]
      if plan.periods[f] == ADAPTIVE:
        p = _stalled_fraction(state.inner_state, new_inner, f)
        a = a + theory.excess_above(p / plan.p_ss, plan.s0, jnp)
        bk = jnp.power(jnp.asarray(plan.decay, jnp.float32),
                       k.astype(jnp.float32))
        flags[f] = a / k.astype(jnp.float32) >= theory.error_of_power(bk)
      else:
        flags[f] = k >= plan.periods[f]
      ages[f], excess[f] = k, a
    for group in plan.groups:
      flag = functools.reduce(jnp.logical_or, [flags[f] for f in group])
      flags.update({f: flag for f in group})

    # Fired fields restart: their age and excess, the field (to zeros or a
    # scaled identity) and the counters it is zeroed with.
    resets = {}
    for f in reset_fields:
      ages[f] = jnp.where(flags[f], 0, ages[f])
      excess[f] = jnp.where(flags[f], 0.0, excess[f])
      resets[f] = state.resets[f] + flags[f].astype(jnp.int32)

    def reset_leaf(name, x):
      if name is None:
        return x
      if name in plan.reset_to:
        return _select_identity(flags[name], x, 1 - plan.decay)
      if name in plan.periods:
        return _select(flags[name], x)
      flag = jnp.zeros([], bool)
      for f in plan.counters[name]:
        flag = flag | flags[f]
      return _select(flag, x)

    if plan.periods:
      new_inner = _map_fields(reset_leaf, plan.targets, new_inner)
    return updates, ResetState(
        count=optax.safe_increment(state.count), ages=ages, excess=excess,
        resets=resets, inner_state=new_inner)

  return optax.GradientTransformationExtraArgs(init_fn, update_fn)


# -----------------------------------------------------------------------------
# Adam with one age per moment.
# -----------------------------------------------------------------------------


class ScaleByAdamLocalAgeState(NamedTuple):
  """State of [`scale_by_adam_local_age`][optax_q.scale_by_adam_local_age].

  ``count``, ``mu`` and ``nu`` come first, in ``optax.ScaleByAdamState``'s
  order, so the leaves of ``mu`` and ``nu`` have the same flat positions
  (and hence the same stochastic-rounding streams under
  [`quantize_state`][optax_q.quantize_state]) as Optax's Adam.

  Attributes:
    count: All updates (int32).
    mu: The first moment, shaped like the parameters.
    nu: The second moment, shaped like the parameters.
    count_mu: The first moment's local age (updates since its last reset).
    count_nu: The second moment's local age.
  """

  count: jax.Array  # shape=(), dtype=jnp.int32; all updates.
  mu: optax.Updates  # params-shaped, dtype=mu_dtype or the params'.
  nu: optax.Updates  # params-shaped, the params' dtype.
  count_mu: jax.Array  # shape=(), dtype=jnp.int32; mu's local age.
  count_nu: jax.Array  # shape=(), dtype=jnp.int32; nu's local age.


def _update_bound(b1: Any, b2: Any, nesterov: bool) -> Any:
  """Adam's largest per-coordinate update without resets (``inf``: none).

  Returns a Python float (maybe ``inf``) for numbers, a float32 array for
  ``jax.Array`` decays (as injected by ``optax.inject_hyperparams``).
  """
  # With one age k for both moments, every past gradient obeys
  # (1 - b2) b2**(k - i) g_i**2 <= v_k, so with r = b1 / sqrt(b2) < 1
  #   |m_k| <= (1 - b1) sum_i b1**(k - i) |g_i|
  #         <= (1 - b1) / sqrt(1 - b2) * sqrt(v_k) * (1 - r**k) / (1 - r),
  # and as sqrt(1 - b2**k) <= 1 and 1 - r**k <= 1 - b1**k (r > b1),
  #   |m_hat_k| / sqrt(v_hat_k) <= C = (1 - b1) / (sqrt(1 - b2) (1 - r)).
  # eps and eps_root only enlarge the denominator. Nesterov's numerator is
  #   b1 m_k / (1 - b1**(k + 1)) + (1 - b1) g_k / (1 - b1**k):
  # the first term is at most b1 C sqrt(v_hat_k) by the same argument (as
  # 1 - b1**(k + 1) >= 1 - b1**k), the second at most
  # sqrt(v_hat_k / (1 - b2)), because v_k >= (1 - b2) g_k**2,
  # 1 - b2**k <= 1 and (1 - b1) / (1 - b1**k) <= 1. So the Nesterov bound
  # is b1 C + 1 / sqrt(1 - b2). For b1 >= sqrt(b2) the geometric sum does
  # not converge: there is no finite bound.
  if isinstance(b1, jax.Array) or isinstance(b2, jax.Array):
    b1 = jnp.asarray(b1, jnp.float32)
    b2 = jnp.asarray(b2, jnp.float32)
    finite = (b1 < jnp.sqrt(b2)) & (b2 < 1.0)
    b1 = jnp.where(finite, b1, 0.0)  # Any values with a finite bound.
    b2 = jnp.where(finite, b2, 0.25)
    c = (1.0 - b1) / (jnp.sqrt(1.0 - b2) * (1.0 - b1 / jnp.sqrt(b2)))
    if nesterov:
      c = b1 * c + 1.0 / jnp.sqrt(1.0 - b2)
    return jnp.where(finite, c, jnp.inf)
  b1, b2 = float(b1), float(b2)
  if not (b1 < math.sqrt(b2) and b2 < 1.0):
    return math.inf
  c = (1.0 - b1) / (math.sqrt(1.0 - b2) * (1.0 - b1 / math.sqrt(b2)))
  return b1 * c + 1.0 / math.sqrt(1.0 - b2) if nesterov else c


def scale_by_adam_local_age(
    b1: jax.typing.ArrayLike = 0.9,
    b2: jax.typing.ArrayLike = 0.999,
    eps: jax.typing.ArrayLike = 1e-8,
    eps_root: jax.typing.ArrayLike = 0.0,
    mu_dtype: jax.typing.DTypeLike | None = None,
    *,
    nesterov: bool = False,
) -> optax.GradientTransformation:
  r"""``optax.scale_by_adam`` with a separate bias-correction age per moment.

  Each moment is bias-corrected by its own local age (updates since it was
  last zeroed), not by the global step:

  ```tex
  \hat m_t = \frac{m_t}{1 - \beta_1^{k_m}}, \qquad
  \hat v_t = \frac{v_t}{1 - \beta_2^{k_v}}, \qquad
  u_t = \operatorname{clip}\left(
    \frac{\hat m_t}{\sqrt{\hat v_t + \epsilon_{root}} + \epsilon},
    -C, C\right).
  ```

  Adam with one age for both moments obeys
  `|\hat m_t| / \sqrt{\hat v_t} \le C = (1 - \beta_1) /
  (\sqrt{1 - \beta_2}\,(1 - \beta_1/\sqrt{\beta_2}))` (for
  `\beta_1 < \sqrt{\beta_2}`; about 31.8 at the defaults), so the clip
  never binds without resets and this is ``optax.scale_by_adam`` bit for
  bit. With [`reset_state`][optax_q.reset_state] zeroing ``nu`` and ``count_nu``
  but not ``mu`` (asymmetric resets), the next update divides an old momentum by
  the square root of a one-step second moment, `|g_t| + \epsilon`,
  which is unbounded where the current gradient is tiny; the clip limits
  `\hat m_t` to what the local-age `\hat v_t` allows. With
  ``nesterov`` the bound is `\beta_1 C + 1/\sqrt{1 - \beta_2}`; for
  `\beta_1 \ge \sqrt{\beta_2}` there is no finite bound and no clip.

  Args:
    b1: Decay rate of the first moment, in ``[0, 1)``.
    b2: Decay rate of the second moment, in ``[0, 1)``.
    eps: Added to the denominator, ``>= 0``.
    eps_root: Added inside the square root, ``>= 0``.
    mu_dtype: Optional dtype of the first moment.
    nesterov: Nesterov momentum, as in ``optax.scale_by_adam``.

  Returns:
    A `optax.GradientTransformation`.

  Raises:
    ValueError: for a decay outside ``[0, 1)``, a negative or non-finite
      ``eps`` or ``eps_root``, or a non-bool ``nesterov`` (Python and NumPy
      numbers are checked; ``jax.Array`` hyperparameters, as injected by
      ``optax.inject_hyperparams``, are not).

  Examples:
    >>> import jax.numpy as jnp, optax_q
    >>> tx = optax_q.scale_by_adam_local_age()
    >>> state = tx.init({'w': jnp.zeros(3)})
    >>> u, state = tx.update({'w': jnp.ones(3)}, state)
    >>> int(state.count_nu)
    1

  References:
    Kingma & Ba, [Adam: A Method for Stochastic
    Optimization](https://arxiv.org/abs/1412.6980), 2014

    Topollai & Choromanska, [Understanding Quantization of Optimizer States
    in LLM Pre-training: Dynamics of State Staleness and Effectiveness of
    State Resets](https://arxiv.org/abs/2603.16731), 2026 (App. A.7)
  """
  b1 = validation.check_number(b1, 'b1', high=1.0)
  b2 = validation.check_number(b2, 'b2', high=1.0)
  eps = validation.check_number(eps, 'eps')
  eps_root = validation.check_number(eps_root, 'eps_root')
  nesterov = validation.check_bool(nesterov, 'nesterov')
  mu_dtype = None if mu_dtype is None else jnp.dtype(mu_dtype)
  bound = _update_bound(b1, b2, nesterov)

  def scale(m, v):
    u = m / (jnp.sqrt(v + eps_root) + eps)
    if isinstance(bound, float):
      return u if math.isinf(bound) else jnp.clip(u, -bound, bound)
    c = bound.astype(u.dtype)
    return jnp.clip(u, -c, c)

  def init_fn(params):
    zero = lambda: jnp.zeros([], jnp.int32)
    return ScaleByAdamLocalAgeState(
        count=zero(), mu=optax.tree.zeros_like(params, dtype=mu_dtype),
        nu=optax.tree.zeros_like(params), count_mu=zero(), count_nu=zero())

  def update_fn(updates, state, params=None):
    del params
    mu = optax.tree.update_moment(updates, state.mu, b1, 1)
    nu = optax.tree.update_moment_per_elem_norm(updates, state.nu, b2, 2)
    k_mu = optax.safe_increment(state.count_mu)
    k_nu = optax.safe_increment(state.count_nu)
    if nesterov:
      mu_hat = jax.tree.map(
          lambda m, g: b1 * m + (1 - b1) * g,
          optax.tree.bias_correction(mu, b1, optax.safe_increment(k_mu)),
          optax.tree.bias_correction(updates, b1, k_mu))
    else:
      mu_hat = optax.tree.bias_correction(mu, b1, k_mu)
    nu_hat = optax.tree.bias_correction(nu, b2, k_nu)
    updates = jax.tree.map(
        lambda m, v: None if m is None else scale(m, v),
        mu_hat, nu_hat, is_leaf=lambda x: x is None)
    mu = optax.tree.cast(mu, mu_dtype)
    nu = optax.tree.cast_like(nu, state.nu)
    return updates, ScaleByAdamLocalAgeState(
        count=optax.safe_increment(state.count), mu=mu, nu=nu,
        count_mu=k_mu, count_nu=k_nu)

  return optax.GradientTransformation(init_fn, update_fn)


# -----------------------------------------------------------------------------
# The moments of the drop-in optimizers with resets.
# -----------------------------------------------------------------------------


def _auto_period(fmt: Any, b2: Any, given: str) -> int:
  """`optax_q.reset_period` of the stored second-moment format.

  Args:
    fmt: The format the second moment is stored in (or None: float32).
    b2: The second moment's decay.
    given: The format as the caller named it, for error messages.
  """
  if isinstance(b2, jax.Array):
    raise ValueError(
        "reset_every='auto' needs a concrete b2 to compute K* when the "
        'optimizer is built; under optax.inject_hyperparams list b2 in '
        'static_args, or pass an int period.')
  try:
    b2 = validation.check_number(b2, 'b2', low=0.0, high=1.0, closed='()')
  except ValueError as e:
    raise ValueError(
        "reset_every='auto' computes K* from b2, which must lie in (0, 1); "
        f'got b2={reprlib.repr(b2)}. Pass an int period, or a b2 in (0, 1).'
    ) from e
  if fmt is None:
    fmt = formats_lib.get_format('fp32')
  stored = '' if fmt.name == given else f' (stored as {fmt.name})'
  try:
    theory.format_epsilon(fmt)
  except ValueError as e:
    raise ValueError(
        f"reset_every='auto' needs a second-moment format the stall "
        f'model can describe (bf16, fp16, fp8_e4m3, fp8_e5m2, '
        f'fp4_e2m1 (stored as fp4_e2m2u), fp4_e2m2u, e{{E}}m{{M}}); got '
        f'nu_format={given!r}{stored}. Pass an int period instead.') from e
  try:
    return theory.reset_period(fmt, b2=b2)
  except ValueError as e:
    raise ValueError(
        f"reset_every='auto' found no reset period for "
        f'nu_format={given!r}{stored} at b2={b2!r}: {e} Pass an int period '
        'instead.') from e


def resolve_reset_every(  # pylint: disable=too-many-branches
    reset_every: Any,
    nu_format: Any,
    b2: Any,
    rounding: str = 'nearest',
    eps: Any = None,
    *,
    b1: Any = None,
) -> dict[str, int | str]:
  """``{moment: period or 'adaptive'}`` for a ``reset_every`` argument.

  ``'auto'`` becomes `optax_q.reset_period` at ``b2`` (``s0 = 0.6``)
  of the format the second moment is actually stored in
  (`optax_q.unsigned_variant` of ``nu_format``: ``fp4_e2m1`` is stored
  as ``fp4_e2m2u``), used for both moments as in the paper.

  Args:
    reset_every: ``None``, an int in ``[1, 2**31 - 1]``, ``'auto'``,
      ``'adaptive'``, or a dict ``{'mu' | 'nu': one of those}``.
    nu_format: The second moment's format, a name or `Format` (for
      ``'auto'`` and the warnings).
    b2: The second moment's decay (for ``'auto'``).
    rounding: For the warning on small predicted stall rates.
    eps: Adam's eps, for the warning on second-moment-only resets.
    b1: Adam's ``b1``, for the bound quoted in that warning.

  Returns:
    The periods of the moments that are reset.

  Raises:
    ValueError: for a period that is none of the above, for ``'auto'`` with
      ``b2`` outside ``(0, 1)`` (named first) or a format the stall model
      does not describe.
  """
  allowed = (AUTO, ADAPTIVE)
  if isinstance(reset_every, Mapping):
    unknown = sorted(set(map(str, reset_every)) - set(ADAM_MOMENTS))
    if unknown:
      raise ValueError(
          f'reset_every names unknown moment(s) {unknown}; allowed: '
          f'{list(ADAM_MOMENTS)}.')
    raw = {f: validation.check_period(p, f'reset_every[{f!r}]', allowed)
           for f, p in reset_every.items()}
  else:
    p = validation.check_period(reset_every, 'reset_every', allowed)
    raw = {f: p for f in ADAM_MOMENTS}
  fmt = given = nu_format
  if fmt is not None:
    given = formats_lib.get_format(fmt)
    fmt = formats_lib.unsigned_variant(given)
  given = 'fp32' if given is None else given.name
  out = {}
  for f, p in raw.items():
    if p == AUTO:
      p = _auto_period(fmt, b2, given)
    if p is not None:
      out[f] = p

  # Warnings, where the policy is likely not what the caller wants.
  for f, p in out.items():
    if isinstance(p, int) and p < 2:
      validation.warn(
          f'reset period {p} for {f!r}: every update restarts the moment, '
          'which turns Adam into sign descent.')
  if 'nu' in out and out.get('mu') != out['nu']:
    # Second-moment-only resets rely on Adam's update bound.
    try:
      bound = f'{_update_bound(b1, b2, False):.3g}'
    except (TypeError, ValueError, jax.errors.ConcretizationTypeError):
      bound = '(1 - b1) / (sqrt(1 - b2) (1 - b1 / sqrt(b2)))'
    small_eps = (isinstance(eps, numbers.Real) and not isinstance(eps, bool)
                 and eps < 1e-6)
    validation.warn(
        f'Resetting nu without mu (reset_every={reset_every!r}): the first '
        'update after each such reset divides the carried-over momentum by '
        'the square root of a one-step second moment, |g| + eps, which is '
        'tiny where the current gradient is. The update is clipped to '
        f"Adam's bound C = {bound} per coordinate (before the learning rate; "
        'Adam without resets never exceeds it), so such steps can still be '
        'up to C times the size of an Adam step on a fresh moment. '
        + ('At eps < 1e-6 such steps are frequent. ' if small_eps else '')
        + 'Give both moments the same policy to reset them together.')
  if not out:
    return out
  if fmt is None or fmt.is_identity:
    validation.warn(
        'Resets enabled on float32 moments: they do not stall, and the paper '
        'finds resets slightly hurt there.')
    return out
  try:
    p_ss = theory.stall_probability(fmt, b2, rounding)
  except (ValueError, TypeError, jax.errors.ConcretizationTypeError):
    p_ss = None
  if p_ss is not None and p_ss < 0.5:
    validation.warn(
        f'Resets enabled, but the predicted steady-state stall rate of '
        f'nu_format={given!r} at b2={b2} is only {p_ss:.2f}; resets '
        'are not indicated there.')
  return out


def default_decay(b2: Any, adaptive: bool) -> Any:
  """The adaptive rule's decay when none is given: ``b2``, checked."""
  if not adaptive:
    return 0.999  # Periodic resets do not read it.
  try:
    return _check_unit(b2, 'b2')
  except ValueError as e:
    raise ValueError(
        "reset_every='adaptive' uses b2 as the decay of its "
        f'statistical-error term, so b2 must lie in (0, 1); got '
        f'b2={reprlib.repr(b2)}.') from e

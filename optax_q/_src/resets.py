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

* :func:`reset_state` wraps any transform and zeroes chosen fields of its
  state (``'mu'``, ``'nu'``, a preconditioner statistic, ...) every ``K``
  steps, or when the measured staleness says so (``'adaptive'``). Quantized
  leaves (:class:`QArray`) are overwritten with encoded zeros of the same
  dtype, shape and layout, so sharding and memory do not change. The
  decision is a ``jnp.where`` on int32 counters held in the state: one
  compiled step, and a resumed checkpoint repeats the run exactly.
* :func:`scale_by_adam_local_age` is ``optax.scale_by_adam`` with one age per
  moment (``count_mu``, ``count_nu``), so that each moment is bias-corrected
  by the steps since *its own* last reset.
* :func:`reset_where` is the tree surgery itself, for custom loops.

References:
  Topollai & Choromanska, `Understanding Quantization of Optimizer States in
  LLM Pre-training: Dynamics of State Staleness and Effectiveness of State
  Resets <https://arxiv.org/abs/2603.16731>`_, 2026
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple
import warnings

import jax
import jax.numpy as jnp
import optax

from optax_q._src import formats as formats_lib
from optax_q._src import qarray as qarray_lib
from optax_q._src import theory
from optax_q._src import transform

QArray = qarray_lib.QArray

ADAPTIVE = 'adaptive'
AUTO = 'auto'
ADAM_MOMENTS = ('mu', 'nu')


# -----------------------------------------------------------------------------
# Tree surgery.
# -----------------------------------------------------------------------------


def _is_node(x: Any) -> bool:
  return qarray_lib.is_qarray(x) or isinstance(x, transform.QuantizedState)


def _matching_name(path, names) -> str | None:
  """The innermost state-field name on ``path`` that is one of ``names``."""
  found = None
  for k in path:
    if isinstance(k, jax.tree_util.GetAttrKey) and k.name in names:
      found = k.name
  return found


def _map_fields(fn, names, state, *rest):
  """Maps ``fn(name, leaf, *rest_leaves)`` over the leaves of ``state``.

  ``name`` is the innermost field on the leaf's path that is in ``names``
  (or None). :class:`QArray` leaves are passed whole; the inner state of a
  :class:`QuantizedState` is visited, its telemetry (``stalled``) and its
  rounding counter are not.
  """

  def visit(path, x, *xs):
    if isinstance(x, transform.QuantizedState):
      return x._replace(inner_state=_map_fields(
          fn, names, x.inner_state, *(y.inner_state for y in xs)))
    return fn(_matching_name(path, names), x, *xs)

  return jax.tree_util.tree_map_with_path(visit, state, *rest, is_leaf=_is_node)


def _encoded_zeros(q: QArray) -> QArray:
  """A :class:`QArray` of exact zeros with the layout of ``q``.

  Scaled formats get scale 0 (an all-zero block), which decodes to exact
  zeros even on grids without zero (``fp4_e2m2u``).
  """
  z = qarray_lib.encode(
      jnp.zeros(q.shape, jnp.float32), q.fmt, scale_mode=q.scale_mode,
      block_size=q.block_size or 2, key=None, dtype=q.dtype)
  codes = z.codes.astype(q.codes.dtype)
  scale = None if z.scale is None else z.scale.astype(q.scale.dtype)
  return QArray(codes, scale, q.fmt, q.shape, q.dtype, q.scale_mode,
                q.block_size)


def _select(pred: jax.Array, x: Any) -> Any:
  """``x`` where not ``pred``; zeros (encoded zeros for QArrays) where it is."""
  if qarray_lib.is_qarray(x):
    zeros = _encoded_zeros(x)
    return jax.tree.map(lambda z, v: jnp.where(pred, z, v), zeros, x)
  if not hasattr(x, 'dtype'):
    return x
  return jnp.where(pred, jnp.zeros_like(x), x)


def reset_where(
    state: optax.OptState,
    where: Mapping[str, jax.typing.ArrayLike] | jax.typing.ArrayLike,
    fields: Sequence[str] = ADAM_MOMENTS,
) -> optax.OptState:
  """Zeroes the named fields of any optimizer state where a flag is set.

  Every array leaf under a state field named in ``fields`` (the innermost
  ``NamedTuple`` attribute on its path, e.g. ``'mu'`` of
  ``ScaleByAdamState``, at any depth: inside chains, ``optax.masked``,
  ``optax.partition`` and :func:`quantize_state`) is replaced by zeros when
  its flag is true. Quantized leaves become encoded zeros with the same
  codes dtype, shape and scale layout. Flags may be traced: the selection is
  a ``jnp.where``, so this is safe under ``jit`` and never recompiles.

  Args:
    state: Any optimizer state.
    where: A boolean scalar for all ``fields``, or ``{field: flag}``.
    fields: State field names to zero (integer counters included, e.g.
      ``'count_nu'``).

  Returns:
    The state with the same structure, dtypes and shapes.

  Examples:
    >>> import jax.numpy as jnp, optax, optax_q
    >>> tx = optax.scale_by_adam()
    >>> state = tx.init({'w': jnp.ones(3)})
    >>> _, state = tx.update({'w': jnp.ones(3)}, state)
    >>> state = optax_q.reset_where(state, True, fields=('nu',))
    >>> state.nu['w']
    Array([0., 0., 0.], dtype=float32)
  """
  fields = tuple(fields)
  if isinstance(where, Mapping):
    unknown = sorted(set(where) - set(fields))
    if unknown:
      raise ValueError(
          f'where names field(s) {unknown} that are not in fields={fields}.')
    flags = {f: where.get(f, False) for f in fields}
  else:
    flags = {f: where for f in fields}
  flags = {f: jnp.asarray(v, bool) for f, v in flags.items()}
  return _map_fields(
      lambda name, x: x if name is None else _select(flags[name], x),
      frozenset(fields), state)


# -----------------------------------------------------------------------------
# Argument checks.
# -----------------------------------------------------------------------------


def _check_period(value: Any, name: str, allowed: tuple[str, ...]) -> Any:
  if value is None or (isinstance(value, str) and value in allowed):
    return value
  if isinstance(value, bool) or not isinstance(value, int) or value < 1:
    traced = hasattr(value, 'shape') and hasattr(value, 'dtype')
    hint = (' (Under optax.inject_hyperparams, list it in static_args.)'
            if traced else '')
    options = ', '.join(repr(a) for a in allowed)
    raise ValueError(
        f'{name} must be None, a positive int or one of {options}; got '
        f'{value!r}.{hint}')
  return int(value)


def _check_unit(value: Any, name: str) -> Any:
  if isinstance(value, jax.Array):
    return value  # Injected (optax.inject_hyperparams) or traced: unchecked.
  if isinstance(value, bool) or not isinstance(value, (int, float)):
    raise ValueError(f'{name} must be a float in (0, 1), got {value!r}.')
  if not 0.0 < float(value) < 1.0:
    raise ValueError(f'{name} must lie in (0, 1), got {value!r}.')
  return float(value)


def _state_names(state) -> tuple[set[str], set[str]]:
  """(float field names, int field names) of a state's leaves."""
  floats, ints = set(), set()
  flat = jax.tree_util.tree_flatten_with_path(state, is_leaf=_is_node)[0]
  for path, leaf in flat:
    if isinstance(leaf, transform.QuantizedState):
      f, i = _state_names(leaf.inner_state)
      floats |= f
      ints |= i
      continue
    names = [k.name for k in path if isinstance(k, jax.tree_util.GetAttrKey)]
    if not names:
      continue
    if qarray_lib.is_qarray(leaf):
      floats.update(names)
    elif not hasattr(leaf, 'dtype'):
      continue
    elif jnp.issubdtype(leaf.dtype, jnp.floating):
      floats.update(names)
    elif jnp.issubdtype(leaf.dtype, jnp.integer):
      ints.update(names)
  return floats, ints


def _probe_names(inner) -> tuple[set[str], set[str]] | None:
  state = transform.probe_state(inner)
  return None if state is None else _state_names(state)


# -----------------------------------------------------------------------------
# The reset wrapper.
# -----------------------------------------------------------------------------


class ResetState(NamedTuple):
  """State of :func:`reset_state`.

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


def _unchanged(old: Any, new: Any) -> jax.Array:
  """How many stored values did not change (codes for QArrays).

  For quantized leaves the stored codes are compared, as
  :func:`optax_q.stall_fraction` does: with block scales that follow the
  block maximum, the scale moves a little almost every step even where the
  codes do not, and the codes are what staleness is about.
  """
  if qarray_lib.is_qarray(old):
    return qarray_lib.unchanged_count(old, new)
  return jnp.sum(old == new, dtype=jnp.float32)


def _stalled_fraction(old, new, field: str) -> jax.Array:
  """Fraction of the elements of ``field`` whose stored value did not change.

  Pooled over all leaves of the field, weighted by their sizes.
  """
  sums = []

  def visit(name, o, n):
    if name != field or not (qarray_lib.is_qarray(o) or hasattr(o, 'dtype')):
      return o
    size = o.size
    if size:
      sums.append((_unchanged(o, n), size))
    return o

  _map_fields(visit, frozenset({field}), old, new)
  total = sum(s for _, s in sums)
  if not total:
    return jnp.zeros([], jnp.float32)
  return sum(x for x, _ in sums) / jnp.float32(total)


def reset_state(
    inner: optax.GradientTransformation,
    every: int | str | Mapping[str, int | str | None] | None,
    *,
    fields: Sequence[str] = ADAM_MOMENTS,
    counters: Mapping[str, str | Sequence[str]] | None = None,
    decay: float = 0.999,
    s0: float = 0.6,
    p_ss: float = 1.0,
) -> optax.GradientTransformationExtraArgs:
  r"""Resets chosen fields of ``inner``'s state on a schedule.

  Each update runs ``inner``, advances every field's local age ``k`` and,
  after the ``K``-th update since the field's last reset, sets the field to
  zero together with its age counters (Algorithm 1 of the paper). The next
  update reads a zero state and bias-corrects with ``k = 1``, so the moment
  restarts like a fresh Adam moment. Parameters, the global step, learning
  rate schedules and stochastic-rounding counters are never reset.

  A field is any ``NamedTuple`` attribute of the inner state, at any depth
  (``'mu'``, ``'nu'``, ``'trace'``, preconditioner statistics). When
  ``inner`` is a :func:`quantize_state`, quantized leaves are overwritten
  with encoded zeros (scale 0 for scaled formats, so grids without zero such
  as ``fp4_e2m2u`` still decode to exact zeros); codes keep their dtype,
  shape and sharding.

  ``'adaptive'`` fields follow Algorithm 2 of the paper: with
  :math:`P_k` the fraction of the field's stored elements that did not change
  in the ``k``-th update (pooled over all its leaves; stored codes for
  quantized leaves, as :func:`optax_q.stall_fraction` counts them),

  .. math::
    A \leftarrow A + \left[\frac{P_k / P_{ss} - s_0}{1 - s_0}\right]_+,
    \qquad \text{reset if } \frac{A}{k} \ge \frac{2\beta^k}{1 + \beta^k}.

  Args:
    inner: The transform whose state is reset, typically a
      :func:`quantize_state` of :func:`scale_by_adam_local_age`.
    every: The reset period: a positive int ``K`` for every field in
      ``fields``, ``'adaptive'``, ``None`` (never), or a dict
      ``{field: K | 'adaptive' | None}`` (fields not listed are never reset),
      e.g. ``{'nu': 300}`` for the paper's asymmetric FP8 policy.
    fields: Fields reset when ``every`` is not a dict.
    counters: ``{field: counter field(s)}``: integer state fields zeroed
      together with the field (the ages its bias correction reads). By
      default ``count_<field>`` where the inner state has it (as in
      :func:`scale_by_adam_local_age`). For ``optax.scale_by_adam``, whose
      two moments share one ``count``, pass ``{'mu': 'count', 'nu': 'count'}``
      and reset both moments together.
    decay: The EMA decay :math:`\beta` in the statistical-error term of
      adaptive resets (the paper uses :math:`\beta_2`).
    s0: Staleness tolerance of adaptive resets, in ``(0, 1)``.
    p_ss: The steady-state stall normaliser :math:`P_{ss}` of adaptive
      resets, in ``(0, 1]`` (the paper fixes 1).

  Returns:
    A gradient transformation whose state is a :class:`ResetState`.

  Raises:
    ValueError: at construction, for a period that is not a positive int,
      ``'adaptive'`` or ``None``, for a field the inner state does not have,
      or for ``s0``, ``decay`` or ``p_ss`` out of range.

  Examples:
    >>> import jax.numpy as jnp, optax, optax_q
    >>> inner = optax_q.quantize_state(
    ...     optax_q.scale_by_adam_local_age(), {'mu': 'fp8_e4m3',
    ...     'nu': 'fp8_e4m3'}, min_size=0)
    >>> tx = optax.chain(optax_q.reset_state(inner, {'nu': 300}),
    ...                  optax.scale(-1e-3))
    >>> state = tx.init({'w': jnp.zeros((4, 128))})
    >>> int(state[0].ages['nu'])
    0

  References:
    Topollai & Choromanska, `Understanding Quantization of Optimizer States
    in LLM Pre-training: Dynamics of State Staleness and Effectiveness of
    State Resets <https://arxiv.org/abs/2603.16731>`_, 2026 (Algorithms 1, 2)

  .. seealso:: :func:`optax_q.reset_period`, :func:`optax_q.stall_fraction`
  """
  if isinstance(fields, str) or not all(isinstance(f, str) for f in fields):
    raise ValueError(
        f'fields must be a sequence of state field names, got {fields!r}.')
  if isinstance(every, Mapping):
    periods = {f: _check_period(p, f'every[{f!r}]', (ADAPTIVE,))
               for f, p in every.items()}
    for f in periods:
      if not isinstance(f, str):
        raise ValueError(f'every keys must be field names, got {f!r}.')
  else:
    period = _check_period(every, 'every', (ADAPTIVE,))
    periods = {f: period for f in fields}
  periods = {f: p for f, p in periods.items() if p is not None}
  decay = _check_unit(decay, 'decay')
  s0 = _check_unit(s0, 's0')
  if (isinstance(p_ss, bool) or not isinstance(p_ss, (int, float))
      or not 0.0 < p_ss <= 1.0):
    raise ValueError(f'p_ss must be a float in (0, 1], got {p_ss!r}.')
  counter_map: dict[str, list[str]] = {}
  if counters is None:
    for f in periods:
      counter_map.setdefault(f'count_{f}', []).append(f)
  else:
    for f, cs in counters.items():
      if f not in periods:
        continue
      for c in ([cs] if isinstance(cs, str) else cs):
        counter_map.setdefault(c, []).append(f)
  names = _probe_names(inner)
  if names is not None:
    floats, ints = names
    unknown = sorted(set(periods) - floats)
    if unknown:
      raise ValueError(
          f'Unknown state field(s) {unknown} to reset; the state of this '
          f'transform has float fields {sorted(floats)}.')
    if counters is None and 'count' in ints:
      ageless = sorted(f for f in periods if f'count_{f}' not in ints)
      if ageless:
        warnings.warn(
            f'Resetting {ageless} without an age counter: the inner state has '
            "no 'count_<field>' but a shared 'count'. If it bias-corrects by "
            'that count (as optax.scale_by_adam does), a reset moment is '
            "under-corrected; pass counters={field: 'count'} and reset the "
            'moments together, or use scale_by_adam_local_age.', stacklevel=2)
    if counters is not None:
      transform.check_known_fields('counters', counter_map, ints, 'integer')
  target = frozenset(periods) | frozenset(counter_map)
  inner_ex = optax.with_extra_args_support(inner)

  def init_fn(params):
    zero_i = lambda: {f: jnp.zeros([], jnp.int32) for f in sorted(periods)}
    return ResetState(
        count=jnp.zeros([], jnp.int32), ages=zero_i(),
        excess={f: jnp.zeros([], jnp.float32) for f in sorted(periods)},
        resets=zero_i(), inner_state=inner_ex.init(params))

  def update_fn(updates, state, params=None, **extra_args):
    updates, new_inner = inner_ex.update(
        updates, state.inner_state, params, **extra_args)
    ages, excess, resets, flags = {}, {}, {}, {}
    for f in sorted(periods):
      k = optax.safe_increment(state.ages[f])
      a = state.excess[f]
      if periods[f] == ADAPTIVE:
        p = _stalled_fraction(state.inner_state, new_inner, f)
        a = a + jnp.maximum((p / p_ss - s0) / (1.0 - s0), 0.0)
        bk = jnp.power(jnp.asarray(decay, jnp.float32),
                       k.astype(jnp.float32))
        flag = a / k.astype(jnp.float32) >= 2.0 * bk / (1.0 + bk)
      else:
        flag = k >= periods[f]
      flags[f] = flag
      ages[f] = jnp.where(flag, 0, k)
      excess[f] = jnp.where(flag, 0.0, a)
      resets[f] = state.resets[f] + flag.astype(jnp.int32)

    def reset_leaf(name, x):
      if name is None:
        return x
      if name in periods:
        return _select(flags[name], x)
      flag = jnp.zeros([], bool)
      for f in counter_map[name]:
        flag = flag | flags[f]
      return _select(flag, x)

    if periods:
      new_inner = _map_fields(reset_leaf, target, new_inner)
    return updates, ResetState(
        count=optax.safe_increment(state.count), ages=ages, excess=excess,
        resets=resets, inner_state=new_inner)

  return optax.GradientTransformationExtraArgs(init_fn, update_fn)


# -----------------------------------------------------------------------------
# Adam with one age per moment.
# -----------------------------------------------------------------------------


class ScaleByAdamLocalAgeState(NamedTuple):
  """State of :func:`scale_by_adam_local_age`.

  ``count``, ``mu`` and ``nu`` come first, in ``optax.ScaleByAdamState``'s
  order, so the leaves of ``mu`` and ``nu`` have the same flat positions
  (and hence the same stochastic-rounding streams under
  :func:`quantize_state`) as Optax's Adam.
  """

  count: jax.Array  # shape=(), dtype=jnp.int32; all updates.
  mu: optax.Updates  # params-shaped, dtype=mu_dtype or the params'.
  nu: optax.Updates  # params-shaped, the params' dtype.
  count_mu: jax.Array  # shape=(), dtype=jnp.int32; mu's local age.
  count_nu: jax.Array  # shape=(), dtype=jnp.int32; nu's local age.


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

  .. math::
    \hat m_t = \frac{m_t}{1 - \beta_1^{k_m}}, \qquad
    \hat v_t = \frac{v_t}{1 - \beta_2^{k_v}}.

  Without resets both ages equal ``count`` and this is ``optax.scale_by_adam``
  bit for bit. With :func:`reset_state` zeroing ``nu`` and ``count_nu``
  together, the second moment restarts like a fresh Adam moment while the
  first moment carries on (asymmetric resets).

  Args:
    b1: Decay rate of the first moment.
    b2: Decay rate of the second moment.
    eps: Added to the denominator.
    eps_root: Added inside the square root.
    mu_dtype: Optional dtype of the first moment.
    nesterov: Nesterov momentum, as in ``optax.scale_by_adam``.

  Returns:
    A :class:`optax.GradientTransformation`.

  Examples:
    >>> import jax.numpy as jnp, optax_q
    >>> tx = optax_q.scale_by_adam_local_age()
    >>> state = tx.init({'w': jnp.zeros(3)})
    >>> u, state = tx.update({'w': jnp.ones(3)}, state)
    >>> int(state.count_nu)
    1

  References:
    Kingma & Ba, `Adam: A Method for Stochastic Optimization
    <https://arxiv.org/abs/1412.6980>`_, 2014

    Topollai & Choromanska, `Understanding Quantization of Optimizer States
    in LLM Pre-training: Dynamics of State Staleness and Effectiveness of
    State Resets <https://arxiv.org/abs/2603.16731>`_, 2026 (App. A.7)
  """
  mu_dtype = None if mu_dtype is None else jnp.dtype(mu_dtype)

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
        lambda m, v: None if m is None else m / (jnp.sqrt(v + eps_root) + eps),
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


def resolve_reset_every(
    reset_every: Any,
    nu_format: Any,
    b2: float,
    rounding: str = 'nearest',
    eps: Any = None,
) -> dict[str, int | str]:
  """``{moment: period or 'adaptive'}`` for a ``reset_every`` argument.

  ``'auto'`` becomes :func:`optax_q.reset_period` of the second moment's
  format at ``b2`` (``s0 = 0.6``), used for both moments as in the paper.

  Args:
    reset_every: ``None``, a positive int, ``'auto'``, ``'adaptive'``, or a
      dict ``{'mu' | 'nu': one of those}``.
    nu_format: The second moment's format (for ``'auto'``).
    b2: The second moment's decay (for ``'auto'``).
    rounding: For the warning on small predicted stall rates.
    eps: Adam's eps, for the warning on second-moment-only resets.

  Returns:
    The periods of the moments that are reset.
  """
  allowed = (AUTO, ADAPTIVE)
  if isinstance(reset_every, Mapping):
    unknown = sorted(set(map(str, reset_every)) - set(ADAM_MOMENTS))
    if unknown:
      raise ValueError(
          f'reset_every names unknown moment(s) {unknown}; allowed: '
          f'{list(ADAM_MOMENTS)}.')
    raw = {f: _check_period(p, f'reset_every[{f!r}]', allowed)
           for f, p in reset_every.items()}
  else:
    p = _check_period(reset_every, 'reset_every', allowed)
    raw = {f: p for f in ADAM_MOMENTS}
  out = {}
  for f, p in raw.items():
    if p == AUTO:
      if isinstance(b2, jax.Array):
        raise ValueError(
            "reset_every='auto' needs a concrete b2 to compute K* when the "
            'optimizer is built; under optax.inject_hyperparams list b2 in '
            'static_args, or pass an int period.')
      fmt = nu_format if nu_format is not None else 'fp32'
      name = getattr(fmt, 'name', fmt)
      try:
        p = theory.reset_period(fmt, b2=b2)
      except ValueError as e:
        raise ValueError(
            f"reset_every='auto' needs a second-moment format the stall "
            f'model can describe (bf16, fp16, fp8_e4m3, fp8_e5m2, '
            f'fp4_e2m2u, e{{E}}m{{M}}); got nu_format={name!r}. Pass an int '
            'period instead.') from e
    if p is not None:
      out[f] = p
  for f, p in out.items():
    if isinstance(p, int) and p < 2:
      warnings.warn(
          f'reset period {p} for {f!r}: every update restarts the moment, '
          'which turns Adam into sign descent.', stacklevel=3)
  if ('nu' in out and 'mu' not in out and isinstance(eps, (int, float))
      and eps < 1e-6):
    warnings.warn(
        f'Resetting nu without mu at eps={eps}: the first update after each '
        'reset divides the carried-over momentum by |g| + eps of a single '
        'step, which explodes where the current gradient is tiny (our GPT '
        'ablation diverged at eps=1e-8 and trained at the paper\'s 1e-6). '
        'Use eps >= 1e-6 or reset both moments.', stacklevel=3)
  fmt = nu_format
  if out and fmt is not None and not getattr(fmt, 'is_identity', False):
    try:
      p_ss = theory.stall_probability(fmt, b2, rounding)
    except (ValueError, TypeError, jax.errors.ConcretizationTypeError):
      p_ss = None
    if p_ss is not None and p_ss < 0.5:
      warnings.warn(
          f'Resets enabled, but the predicted steady-state stall rate of '
          f'nu_format={getattr(fmt, "name", fmt)!r} at b2={b2} is only '
          f'{p_ss:.2f}; resets are not indicated there.', stacklevel=3)
  elif out and (fmt is None or getattr(fmt, 'is_identity', False)):
    warnings.warn(
        'Resets enabled on float32 moments: they do not stall, and the paper '
        'finds resets slightly hurt there.', stacklevel=3)
  return out


def adam_with_resets(
    reset_every: Any,
    *,
    b1: float = 0.9,
    b2: float = 0.999,
    eps: float = 1e-8,
    eps_root: float = 0.0,
    nesterov: bool = False,
    formats: Mapping[str, Any] | None = None,
    rounding: str = 'stochastic',
    block_size: int = 128,
    seed: int = 0,
    min_size: int = 4096,
    decay: float | None = None,
    s0: float = 0.6,
    track_stalls: bool = False,
) -> optax.GradientTransformationExtraArgs:
  r"""Adam's quantized moments with periodic, asymmetric or adaptive resets.

  ``reset_state(quantize_state(scale_by_adam_local_age(...), formats), ...)``:
  the moment transform behind ``optax_q.adamw(..., reset_every=...)``. With
  no moment reset (or a period longer than the run) the updates equal those
  of ``quantize_state(optax.scale_by_adam(...))`` bit for bit.

  Args:
    reset_every: ``None``, a positive int period for both moments,
      ``'auto'`` (the stall model's ``K*`` for the second moment's format and
      ``b2``, used for both moments), ``'adaptive'`` (Algorithm 2, each
      moment on its own measured stall fraction), or a dict such as
      ``{'nu': 300}`` (the paper's best FP8 policy: ``mu`` never reset;
      needs ``eps >= 1e-6``, see the warning it raises otherwise).
    b1: First-moment decay.
    b2: Second-moment decay.
    eps: Added to the denominator.
    eps_root: Added inside the square root.
    nesterov: Nesterov momentum.
    formats: ``{'mu': format, 'nu': format}`` as for :func:`quantize_state`.
    rounding: ``'nearest'`` or ``'stochastic'``.
    block_size: Elements per scale along the last axis.
    seed: Seed of the stochastic rounding.
    min_size: Leaves with fewer elements keep float32 state (they are still
      reset with the rest).
    decay: :math:`\beta` of the adaptive rule; ``b2`` by default.
    s0: Staleness tolerance of the adaptive rule.
    track_stalls: Record per-leaf stalled fractions for
      :func:`stall_fraction` (the adaptive rule does not need them).

  Returns:
    A gradient transformation whose state is a :class:`ResetState`.

  References:
    Topollai & Choromanska, `Understanding Quantization of Optimizer States
    in LLM Pre-training: Dynamics of State Staleness and Effectiveness of
    State Resets <https://arxiv.org/abs/2603.16731>`_, 2026
  """
  formats = dict(formats or {})
  nu_format = formats.get('nu')
  if nu_format is not None:
    nu_format = formats_lib.get_format(nu_format)
  periods = resolve_reset_every(
      reset_every, nu_format, b2, transform.leaf_rounding(rounding, 'nu'),
      eps)
  inner = transform.quantize_state(
      scale_by_adam_local_age(b1=b1, b2=b2, eps=eps, eps_root=eps_root,
                              nesterov=nesterov),
      formats, rounding=rounding, block_size=block_size, seed=seed,
      min_size=min_size, elementwise=True, track_stalls=track_stalls)
  return reset_state(inner, periods, decay=b2 if decay is None else decay,
                     s0=s0)

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
r"""Fidelity of a transform to its float32 twin, on the same gradients.

A low-bit optimizer state can lower the loss by taking larger, noisier
steps than float32 Adam would: stochastic rounding keeps the stored second
moment unbiased, `E[Q(v)] = v`, but not what Adam divides by, and
`1 / (\sqrt{v} + \epsilon)` is convex in `v`, so by Jensen's inequality
`E[1 / (\sqrt{Q(v)} + \epsilon)] \ge 1 / (\sqrt{v} + \epsilon)`: the
steps are systematically larger. A lower loss than float32's is then a
different optimizer, not a faithful one. Fidelity measures the difference
directly: the same gradients go through the transform and through its
float32 twin, and the two updates (and the two weight trajectories) are
compared.

Norms and dot products are float32 sums over every floating-point leaf of
the trees (other leaves are left out). Each tree is first divided by its
largest magnitude, so values whose squares overflow or underflow float32
(`10^{30}`, `10^{-30}`) still give finite results, and two identical trees
compare as exactly 1 (and 0 apart).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from optax_q._src.codec import qarray as qarray_lib
from optax_q._src.core import explicit
from optax_q._src.core import validation

_F32 = jnp.float32
# Denominators below this are zero (float32's smallest normal).
_TINY = float(np.finfo(np.float32).tiny)
_MAX = float(np.finfo(np.float32).max)
METRICS = ('norm_ratio', 'cosine', 'weight_distance')


class UpdateFidelity(NamedTuple):
  r"""How an update compares with a reference update, over a whole pytree.

  Returned by [`update_fidelity`][optax_q.update_fidelity].

  Attributes:
    norm_ratio: `\|u\| / \|u_{ref}\|`, a float32 scalar: 1 when the
      update is as large as the reference's.
    cosine: `\langle u, u_{ref} \rangle / (\|u\| \|u_{ref}\|)`, a
      float32 scalar in [-1, 1]: 1 when it points the same way.
  """

  norm_ratio: jax.Array  # shape=(), dtype=float32.
  cosine: jax.Array  # shape=(), dtype=float32.


class FidelityState(NamedTuple):
  """State of [`track_fidelity`][optax_q.track_fidelity].

  Attributes:
    inner_state: The state of the tracked transform ``tx``.
    reference_state: The state of the float32 ``reference``.
    initial_params: The params given to ``init``, float leaves as float32
      (quantized leaves decoded to float32).
    reference_params: ``initial_params`` plus the running sum of the
      reference's updates (float32): the trajectory the reference would
      take on these gradients.
    count: Updates taken (int32), recorded or not.
    norm_ratio: float32, shape ``(steps,)``: step `k`'s update-norm ratio
      at index `k`, NaN until recorded.
    cosine: float32, shape ``(steps,)``: step `k`'s cosine between the two
      updates, NaN until recorded.
    weight_distance: float32, shape ``(steps,)``: after step `k`, the
      distance of the params from ``reference_params`` relative to how far
      the reference has moved, NaN until recorded.
  """

  inner_state: optax.OptState
  reference_state: optax.OptState
  initial_params: optax.Params  # params-shaped, float leaves float32.
  reference_params: optax.Params  # params-shaped, float leaves float32.
  count: jax.Array  # shape=(), dtype=int32.
  norm_ratio: jax.Array  # shape=(steps,), dtype=float32.
  cosine: jax.Array  # shape=(steps,), dtype=float32.
  weight_distance: jax.Array  # shape=(steps,), dtype=float32.


def _is_float(x: Any) -> bool:
  dtype = getattr(x, 'dtype', None)
  if dtype is None:
    return isinstance(x, float)
  return jnp.issubdtype(dtype, jnp.floating)


def _leaves_like(tree: Any, other: Any, name: str, like: str) -> list[Any]:
  """``other``'s leaves, in the order of ``tree``'s (same structure)."""
  treedef = jax.tree.structure(tree)
  try:
    return treedef.flatten_up_to(other)
  except (ValueError, TypeError) as e:
    raise ValueError(
        f'{name} must have the tree structure of {like}: {e}') from None


def _scaled(leaves: list[jax.Array]) -> tuple[jax.Array, list[jax.Array]]:
  """``(e, leaves / 2**e)`` with ``2**e`` the power of two at or above the
  largest magnitude (``e = 0`` for zeros): the largest scaled magnitude is
  in ``[0.5, 1)``, so sums of squares neither overflow nor underflow.

  The power of two is applied exactly, as two products with normal
  factors: ``2**-e`` alone is subnormal (flushed to zero on CPU) above
  ``2**126``, and XLA turns a division into a product with the reciprocal.
  """
  a = jnp.zeros([], _F32)
  for x in leaves:
    a = jnp.maximum(a, jnp.max(jnp.abs(x), initial=0.0))
  _, e = jnp.frexp(jnp.where(a > 0, a, 1.0))
  one = jnp.float32(1.0)
  down, rest = jnp.ldexp(one, -(e // 2)), jnp.ldexp(one, e // 2 - e)
  return e, [(x * down) * rest for x in leaves]


def _sum_of_squares(xs: list[jax.Array]) -> jax.Array:
  total = jnp.zeros([], _F32)
  for x in xs:
    total = total + jnp.sum(x * x, dtype=_F32)
  return total


def _norm_ratio(e_x, sx, e_y, sy, both_zero: float) -> jax.Array:
  """``||x|| / max(||y||, tiny)``, finite, from the scaled sums of squares
  (``||x|| = 2**e_x sqrt(sx)``); ``both_zero`` when both trees are zero
  (a sum of zero: subnormals flushed count as zero)."""
  x_zero, y_zero = sx == 0, sy == 0
  ratio = jnp.where(
      y_zero, jnp.ldexp(jnp.sqrt(sx), e_x + 126),  # tiny is 2**-126
      jnp.ldexp(jnp.sqrt(sx / jnp.where(y_zero, 1.0, sy)), e_x - e_y))
  ratio = jnp.minimum(ratio, _MAX)
  return jnp.where(x_zero, jnp.where(y_zero, both_zero, 0.0),
                   ratio).astype(_F32)


def _fidelity(u: list[jax.Array], r: list[jax.Array]) -> UpdateFidelity:
  e_u, u = _scaled(u)
  e_r, r = _scaled(r)
  s_u, s_r = _sum_of_squares(u), _sum_of_squares(r)
  # The cosine from the distance between the scaled trees (the cosine of
  # the trees themselves): exactly 1 where they are equal, however XLA
  # orders the sums.
  s_d = _sum_of_squares([x - y for x, y in zip(u, r)])
  one_zero = (s_u == 0) | (s_r == 0)
  cosine = jnp.clip(
      (s_u + s_r - s_d) / (2 * jnp.sqrt(jnp.where(one_zero, 1.0, s_u * s_r))),
      -1.0, 1.0)
  cosine = jnp.where(s_d == 0, 1.0, jnp.where(one_zero, 0.0, cosine))
  ratio = _norm_ratio(e_u, s_u, e_r, s_r, both_zero=1.0)
  return UpdateFidelity(
      norm_ratio=jnp.where((s_d == 0) & (e_u == e_r), 1.0,
                           ratio).astype(_F32),
      cosine=cosine.astype(_F32))


def update_fidelity(
    updates: optax.Updates,
    reference_updates: optax.Updates,
) -> UpdateFidelity:
  r"""Compares an update with a reference update over a whole pytree.

  For the update `u` and the reference update `u_{ref}` (every
  floating-point leaf, cast to float32, as one vector; other leaves are
  left out),

  ```tex
  \text{norm\_ratio} = \frac{\|u\|}{\max(\|u_{ref}\|, \tau)}, \qquad
  \text{cosine} = \frac{\langle u, u_{ref} \rangle}{\|u\|\,\|u_{ref}\|},
  ```

  with `\tau` float32's smallest normal number. Both are finite for any
  finite input: when both updates are zero the norm ratio and the cosine
  are 1 (the same step); when only the reference is zero the norm ratio is
  `\|u\| / \tau` (capped at float32's largest finite value) and the cosine
  0; when only `u` is zero both are 0. A faithful update has both near 1.

  Args:
    updates: The updates to judge (any pytree of arrays, any float dtypes).
    reference_updates: The reference's updates, with the tree structure of
      ``updates``.

  Returns:
    An [`UpdateFidelity`][optax_q.UpdateFidelity] of float32 scalars.

  Raises:
    ValueError: if the two trees differ in structure.

  Examples:
    >>> import jax.numpy as jnp, optax_q
    >>> u = {'w': jnp.array([2.0, 0.0]), 'b': jnp.array(0.0)}
    >>> ref = {'w': jnp.array([1.0, 1.0]), 'b': jnp.array(0.0)}
    >>> fid = optax_q.update_fidelity(u, ref)
    >>> print(f'{fid.norm_ratio:.4f} {fid.cosine:.4f}')
    1.4142 0.7071
  """
  u = jax.tree.leaves(updates)
  r = _leaves_like(updates, reference_updates, 'reference_updates',
                   'updates')
  floats = [_is_float(x) for x in u]
  return _fidelity([jnp.asarray(x, _F32) for x in u if _is_float(x)],
                   [jnp.asarray(y, _F32) for y, f in zip(r, floats) if f])


def weight_distance(
    params: optax.Params,
    reference_params: optax.Params,
    initial_params: optax.Params,
) -> jax.Array:
  r"""Distance from a reference trajectory, relative to how far it moved.

  With `p` the params, `p_{ref}` the reference's and `p_0` where both
  started (every floating-point leaf, in float32, as one vector),

  ```tex
  \text{weight\_distance} =
    \frac{\|p - p_{ref}\|}{\max(\|p_{ref} - p_0\|, \tau)},
  ```

  with `\tau` float32's smallest normal number: 0 when the params are the
  reference's (even if neither moved), `\|p - p_{ref}\| / \tau` (capped at
  float32's largest finite value) when they differ but the reference has
  not moved. 0.1 means the params have strayed from the reference by a
  tenth of the reference's own travel.

  Args:
    params: The params (any pytree of arrays, any float dtypes).
    reference_params: The reference's params, with ``params``' tree
      structure.
    initial_params: The params both started from, with ``params``' tree
      structure.

  Returns:
    A float32 scalar, finite for finite inputs.

  Raises:
    ValueError: if the trees differ in structure.

  Examples:
    >>> import jax.numpy as jnp, optax_q
    >>> p0 = {'w': jnp.zeros(2)}
    >>> ref = {'w': jnp.array([3.0, 4.0])}
    >>> p = {'w': jnp.array([3.0, 3.5])}
    >>> print(f'{optax_q.weight_distance(p, ref, p0):.4f}')
    0.1000
  """
  p = jax.tree.leaves(params)
  ref = _leaves_like(params, reference_params, 'reference_params', 'params')
  p0 = _leaves_like(params, initial_params, 'initial_params', 'params')
  off, moved = [], []
  for x, y, z in zip(p, ref, p0):
    if _is_float(x):
      y = jnp.asarray(y, _F32)
      off.append(jnp.asarray(x, _F32) - y)
      moved.append(y - jnp.asarray(z, _F32))
  e_off, off = _scaled(off)
  e_moved, moved = _scaled(moved)
  return _norm_ratio(e_off, _sum_of_squares(off), e_moved,
                     _sum_of_squares(moved), both_zero=0.0)


def _float32_copy(tree: Any) -> Any:
  """``tree`` with float leaves as float32 copies, other arrays copied (no
  buffer is shared with the caller's params, which may be donated)."""
  return jax.tree.map(
      lambda x: jnp.array(x, _F32 if _is_float(x) else None, copy=True),
      tree)


def _has_qarrays(params: Any) -> bool:
  """Whether ``params`` holds [`QArray`][optax_q.QArray] leaves (master-free
  weights, as [`optax_q.eco`][optax_q.eco] trains)."""
  return any(map(qarray_lib.is_qarray,
                 jax.tree.leaves(params, is_leaf=qarray_lib.is_qarray)))


def _decoded(params: Any) -> Any:
  """``params`` with its QArray leaves decoded to float32 (others kept)."""
  return jax.tree.map(
      lambda x: qarray_lib.dequantize(x, _F32)
      if qarray_lib.is_qarray(x) else x, params,
      is_leaf=qarray_lib.is_qarray)


def _landed(params: Any, decoded: Any, updates: Any) -> tuple[Any, Any]:
  """The weights ``updates`` gives params with QArray leaves, and the steps
  that took them there, as trees of the decoded params' structure (float32
  for the quantized leaves, the plain leaves' own dtypes for the rest).

  ``decoded`` is ``params`` decoded (`_decoded`), computed once per step
  for the reference too. A QArray leaf's update holds its new quantized
  weights (the
  ``NewWeights`` of [`optax_q.eco`][optax_q.eco]), whose ``weights``
  method writes them into the parameter's layout as
  [`optax_q.apply_updates`][optax_q.apply_updates] does: the applied weight
  is the new QArray decoded, and the step is that minus the old one
  decoded. A plain leaf takes ``p + u`` in its dtype, as
  ``optax.apply_updates`` does, and its step is ``u``.
  """
  flat, treedef = jax.tree_util.tree_flatten_with_path(
      params, is_leaf=qarray_lib.is_qarray)
  try:
    flat_u = treedef.flatten_up_to(updates)
  except (ValueError, TypeError) as e:
    raise ValueError(
        'the updates of tx must have the structure of params (one update '
        f'per QArray leaf): {e}') from None
  applied, steps = [], []
  for (path, p), old, u in zip(flat, treedef.flatten_up_to(decoded), flat_u):
    if qarray_lib.is_qarray(p):
      where = jax.tree_util.keystr(path)
      if not callable(getattr(u, 'weights', None)):
        raise ValueError(
            f'the update of the quantized parameter {where} is of type '
            f'{type(u).__name__}, not new quantized weights: a transform '
            'that trains QArray params (optax_q.eco) returns them.')
      new = qarray_lib.dequantize(u.weights(p, where), _F32)
      applied.append(new)
      # A weight that kept its value took no step: the compiler may fuse
      # the decode into the difference (a multiply-subtract), which would
      # otherwise leave the last bits of the product for a weight that
      # did not move.
      steps.append(jnp.where(new == old, _F32(0), new - old))
    else:
      applied.append(optax.apply_updates(p, u))
      steps.append(u)
  return treedef.unflatten(applied), treedef.unflatten(steps)


def track_fidelity(
    tx: optax.GradientTransformation,
    reference: optax.GradientTransformation,
    *,
    steps: int,
) -> optax.GradientTransformationExtraArgs:
  r"""Runs a float32 reference beside ``tx`` and records how they compare.

  Every update gives the gradients and params to ``tx`` and returns
  ``tx``'s updates unchanged (bit for bit: wrapping changes no training
  run). For the first ``steps`` updates it also gives the same gradients
  and the same params, in float32, to ``reference`` (``tx``'s float32
  twin: e.g. ``optax.adamw(1e-3)`` beside
  ``optax_q.adamw(1e-3, mu_format='nf4', nu_format='ue4m0')``) and records
  at step `k`, with `u_k` the update of ``tx``, `r_k` the reference's,
  `p_k` the params given and `p_0` the initial params,

  ```tex
  \text{norm\_ratio}_k = \frac{\|u_k\|}{\|r_k\|}, \qquad
  \text{cosine}_k = \frac{\langle u_k, r_k \rangle}{\|u_k\|\,\|r_k\|},
  \qquad
  \text{weight\_distance}_k =
    \frac{\|(p_k + u_k) - \bar p_{k+1}\|}{\|\bar p_{k+1} - p_0\|},
  \qquad \bar p_{k+1} = p_0 + \sum_{j \le k} r_j,
  ```

  as [`update_fidelity`][optax_q.update_fidelity] and
  [`weight_distance`][optax_q.weight_distance] define them (finite, with
  their conventions at zero); `p_k + u_k` is taken as
  ``optax.apply_updates`` takes it, in the params' dtype. The first two
  judge one step from the same point; the third the trajectory, where
  differences add up. After ``steps`` updates the reference is skipped
  (a ``lax.cond``) and the records stay as they are; read them with
  [`fidelity_summary`][optax_q.fidelity_summary]. The state holds the
  reference's state and two float32 copies of the params (with an Adam
  reference, four float32 copies in all), after ``steps`` too: track a
  diagnostic run, or a small model.

  Master-free params (with [`QArray`][optax_q.QArray] leaves, as
  [`optax_q.eco`][optax_q.eco] trains them) have no float weights to add
  updates to: ``tx``'s update of a quantized leaf is its new quantized
  weights, written by [`optax_q.apply_updates`][optax_q.apply_updates].
  The reference is then initialized on, and at every step given, the
  decoded params `D(p_k)` (quantized leaves decoded to float32, plain
  leaves as they are), and the update compared for a quantized leaf is the
  step that lands its decoded weight on the grid,

  ```tex
  u_k = D(p_{k+1}) - D(p_k), \qquad
  p_{k+1} = \text{apply\_updates}(p_k, \text{tx's update}),
  ```

  rounding of the new weight included (for a plain leaf `u_k` is
  ``tx``'s update). The weight distance takes the decoded weights too:
  `D(p_{k+1})` for `p_k + u_k` and `D(p_0)` for `p_0`. A quantized leaf
  whose update is not new weights (a float array) raises a
  ``ValueError``.

  Why not compare losses: stochastic rounding keeps a low-bit second
  moment unbiased, `E[Q(v)] = v`, but `1 / (\sqrt{v} + \epsilon)` is
  convex, so by Jensen's inequality its expectation under rounding is
  larger than at `v`: low-bit states take systematically larger (and
  noisier) steps, which can lower the loss of a short run below float32's.
  That is a different optimizer, not float32 quality. Faithful means an
  update-norm ratio near 1, a cosine near 1 and a small weight distance.

  Args:
    tx: The transform to judge (its updates are the ones returned).
    reference: Its float32 twin, with the same hyperparameters. It is
      initialized on float32 params and receives float32 gradients and
      params (decoded, for quantized params), so that its state is float32
      even for bf16 or quantized params.
    steps: How many updates to compare and record, a positive int (it sets
      the shape of the records).

  Returns:
    A gradient transformation whose state is a
    [`FidelityState`][optax_q.FidelityState]. Its ``update`` needs
    ``params``; extra keyword arguments go to both transforms.

  Raises:
    TypeError: at construction, if ``tx`` or ``reference`` is not a
      gradient transformation.
    ValueError: at construction, if ``steps`` is not a positive int (bools
      are not); at ``update``, if ``params`` is None, or if ``tx``'s
      update of a quantized (``QArray``) parameter is not new quantized
      weights.

  Examples:
    >>> import jax, jax.numpy as jnp, optax, optax_q
    >>> params = {'w': jnp.linspace(-1.0, 1.0, 8192).reshape(64, 128)}
    >>> loss = lambda p: jnp.sum((p['w'] - 0.5) ** 2)
    >>> tx = optax_q.track_fidelity(
    ...     optax_q.adamw(1e-2, mu_format='int8_dynamic',
    ...                   nu_format='int8_dynamic'),
    ...     optax.adamw(1e-2), steps=20)
    >>> state = tx.init(params)
    >>> @jax.jit
    ... def step(params, state):
    ...   updates, state = tx.update(jax.grad(loss)(params), state, params)
    ...   return optax.apply_updates(params, updates), state
    >>> for _ in range(20):
    ...   params, state = step(params, state)
    >>> summary = optax_q.fidelity_summary(state)
    >>> summary['steps'], summary['cosine']['median'] > 0.99
    (20, True)

  References:
    Kingma & Ba, [Adam: A Method for Stochastic
    Optimization](https://arxiv.org/abs/1412.6980), 2015

    Dettmers et al, [8-bit Optimizers via Block-wise
    Quantization](https://arxiv.org/abs/2110.02861), 2022
  """
  validation.check_transform(tx, 'tx')
  validation.check_transform(reference, 'reference')
  steps = validation.check_int(
      steps, 'steps', low=1, high=validation.MAX_PERIOD,
      what='a positive int (in [1, 2**31 - 1]; not a bool)')
  tx = optax.with_extra_args_support(tx)
  reference = optax.with_extra_args_support(reference)

  def init_fn(params):
    params32 = _float32_copy(_decoded(params))
    # No two fields share a buffer: a state may be donated.
    records = {name: jnp.full((steps,), jnp.nan, _F32) for name in METRICS}
    return FidelityState(
        inner_state=tx.init(params),
        reference_state=reference.init(params32),
        initial_params=params32,
        reference_params=_float32_copy(params32),
        count=jnp.zeros([], jnp.int32),
        **records)

  def update_fn(updates, state, params=None, **extra_args):
    if params is None:
      raise ValueError(
          'track_fidelity needs params: call update(updates, state, '
          'params) (the reference runs on the same params, and the weight '
          'distance is measured from them).')
    new_updates, inner_state = tx.update(
        updates, state.inner_state, params, **extra_args)

    recording = state.count < steps
    # Master-free params (QArray leaves) reach the reference decoded.
    master_free = _has_qarrays(params)
    decoded = _decoded(params) if master_free else params
    grads32, params32 = jax.tree.map(
        lambda x: jnp.asarray(x, _F32) if _is_float(x) else x,
        (updates, decoded))

    def run_reference(ref_state):
      return reference.update(grads32, ref_state, params32, **extra_args)

    def skip_reference(ref_state):
      shapes, _ = jax.eval_shape(run_reference, ref_state)
      return jax.tree.map(
          lambda x: explicit.like(jnp.zeros(x.shape, x.dtype), x),
          shapes), ref_state

    # Two conditionals: the reference's updates leave the first one
    # rounded to their dtype and enter the second as operands, as tx's do,
    # so that XLA cannot fuse their last multiply with the addition to the
    # reference's params (a fused multiply-add rounds once, not twice), and
    # identical transforms stay exactly together.
    ref_updates, ref_state = jax.lax.cond(
        recording, run_reference, skip_reference, state.reference_state)

    def record(ref_params, records, landed):
      ref_params = jax.tree.map(
          lambda p, r: p + jnp.asarray(r, _F32) if _is_float(p) else p,
          ref_params, ref_updates)
      if master_free:
        applied, steps_taken = landed
      else:
        applied = optax.apply_updates(params, new_updates)
        steps_taken = new_updates
      fid = update_fidelity(steps_taken, ref_updates)
      values = dict(
          norm_ratio=fid.norm_ratio, cosine=fid.cosine,
          weight_distance=weight_distance(applied, ref_params,
                                          state.initial_params))
      return ref_params, {name: records[name].at[state.count].set(
          values[name]) for name in METRICS}

    # Only what recording changes passes through the conditional, and the
    # decoded weights of master-free params: as operands they are rounded
    # products, the very values `init` and the reference saw, where decoded
    # inside they could fuse into a multiply-subtract with the reference's
    # params and show a weight that did not move as moved.
    ref_params, records = jax.lax.cond(
        recording, record, lambda *kept: kept[:2], state.reference_params,
        {name: getattr(state, name) for name in METRICS},
        _landed(params, decoded, new_updates) if master_free else None)
    return new_updates, state._replace(
        inner_state=inner_state, reference_state=ref_state,
        reference_params=ref_params, count=optax.safe_increment(state.count),
        **records)

  return optax.GradientTransformationExtraArgs(init_fn, update_fn)


def fidelity_summary(state: optax.OptState) -> dict[str, Any]:
  """Statistics of what track_fidelity recorded, on the host (NumPy).

  Over the steps [`track_fidelity`][optax_q.track_fidelity] recorded, for
  each of ``'norm_ratio'``, ``'cosine'`` and ``'weight_distance'``:
  the median, the 10th and 90th percentiles, the mean and the last
  recorded value, as Python floats (NaN when nothing was recorded yet).

  Args:
    state: A [`FidelityState`][optax_q.FidelityState], or any optimizer
      state holding exactly one (inside ``optax.chain``,
      ``optax.MultiSteps``, ...).

  Returns:
    ``{'steps': n, 'norm_ratio': {'median': ..., 'p10': ..., 'p90': ...,
    'mean': ..., 'last': ...}, 'cosine': {...}, 'weight_distance': {...}}``
    with ``n`` the number of steps recorded.

  Raises:
    ValueError: if ``state`` holds no ``FidelityState`` or more than one.

  Examples:
    >>> import jax.numpy as jnp, optax, optax_q
    >>> tx = optax.chain(optax.clip_by_global_norm(1.0),
    ...                  optax_q.track_fidelity(optax.sgd(0.1),
    ...                                         optax.sgd(0.1), steps=4))
    >>> params = {'w': jnp.ones(3)}
    >>> state = tx.init(params)
    >>> _, state = tx.update({'w': jnp.ones(3)}, state, params)
    >>> summary = optax_q.fidelity_summary(state)
    >>> summary['steps'], summary['cosine']['median']
    (1, 1.0)
  """
  is_fidelity = lambda x: isinstance(x, FidelityState)
  found = [x for x in jax.tree.leaves(state, is_leaf=is_fidelity)
           if is_fidelity(x)]
  if len(found) != 1:
    raise ValueError(
        f'fidelity_summary: state must hold exactly one FidelityState (the '
        f'state of track_fidelity, at any depth), found {len(found)}.')
  found = found[0]
  n = min(int(np.asarray(found.count)), int(np.shape(found.norm_ratio)[0]))
  out: dict[str, Any] = {'steps': n}
  for name in METRICS:
    x = np.asarray(getattr(found, name), np.float64)[:n]
    if n:
      out[name] = {'median': float(np.median(x)),
                   'p10': float(np.percentile(x, 10)),
                   'p90': float(np.percentile(x, 90)),
                   'mean': float(np.mean(x)), 'last': float(x[-1])}
    else:
      out[name] = dict.fromkeys(('median', 'p10', 'p90', 'mean', 'last'),
                                float('nan'))
  return out

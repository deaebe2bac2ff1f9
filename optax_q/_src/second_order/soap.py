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
"""SOAP: Adam in the eigenbasis of Shampoo's factor statistics.

``scale_by_soap`` is plain float32 arithmetic on a state whose every
statistic is a separate field (see `optax_q._src.second_order.shampoo`);
`optax_q.soap` stores them in low precision and resets them.
"""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

from optax_q._src.core import explicit
from optax_q._src.second_order import preconditioner as pc


class ScaleBySoapState(NamedTuple):
  """State of [`scale_by_soap`][optax_q.scale_by_soap].

  For every parameter of rank >= 2, ``mu`` and ``nu`` are block stacks
  ``(grid_rows, grid_cols, rows, cols)`` in the rotated coordinates and the
  matrix fields stacks ``(grid_rows, grid_cols, n, n)``; for the others
  ``mu`` and ``nu`` are shaped like the parameter and the matrix fields are
  ``optax.MaskedNode``.

  Attributes:
    count: Updates so far (int32); the bases refresh when it is a multiple
      of ``precondition_frequency``.
    mu: Adam's first moment, in the current eigenbasis.
    nu: Adam's second moment, in the current eigenbasis.
    stats_l: Left factor statistics ``Q_L^T EMA[G G^T] Q_L``.
    stats_r: Right factor statistics, likewise.
    eigvecs_l: Left eigenbases (orthogonal).
    eigvecs_r: Right eigenbases.
    count_mu: Updates of ``mu`` since its last reset.
    count_nu: Updates of ``nu`` since its last reset.
    count_stats_l: Updates of ``stats_l`` since its last reset.
    count_stats_r: Updates of ``stats_r`` since its last reset.
  """

  count: jax.Array
  mu: Any
  nu: Any
  stats_l: Any
  stats_r: Any
  eigvecs_l: Any
  eigvecs_r: Any
  count_mu: jax.Array
  count_nu: jax.Array
  count_stats_l: jax.Array
  count_stats_r: jax.Array


def _moment_shape(p, max_dim: int):
  lay = pc.layout(p.shape, max_dim)
  return p.shape if lay is None else lay.blocks_shape


def _init(cfg: pc.Settings, params) -> ScaleBySoapState:
  zeros = lambda: jax.tree.map(lambda p: jnp.zeros(
      _moment_shape(p, cfg.max_dim), jnp.float32), params)
  return ScaleBySoapState(mu=zeros(), nu=zeros(),
                          **pc.initial_factors(params, cfg.max_dim))


class _Block(NamedTuple):
  """A matrix parameter's moments, statistics and bases in one basis."""

  mu: jax.Array
  nu: jax.Array
  s_l: jax.Array
  s_r: jax.Array
  q_l: jax.Array
  q_r: jax.Array


def _first_basis(b: _Block, lay: pc.Layout) -> _Block:
  """The first refresh: eigenbases of the statistics (the moments are
  still zero)."""
  left = pc.eigh(b.s_l, b.q_l, lay.padding('l'), canonical_null=True)
  right = pc.eigh(b.s_r, b.q_r, lay.padding('r'), canonical_null=True)
  keep = lambda ok, new, old: jnp.where(ok[..., None, None], new, old)
  return b._replace(
      s_l=keep(left.ok, pc.diag_embed(left.values), b.s_l),
      s_r=keep(right.ok, pc.diag_embed(right.values), b.s_r),
      q_l=left.vectors, q_r=right.vectors)


def _power_basis(b: _Block, lay: pc.Layout) -> _Block:
  """A later refresh: one QR power iteration per side; the first moment
  rotated into the new basis, the second permuted with its columns."""
  left = pc.power_qr(b.s_l, b.q_l, lay.padding('l'))
  right = pc.power_qr(b.s_r, b.q_r, lay.padding('r'))
  r_l = pc.mm(jnp.swapaxes(left.vectors, -1, -2), b.q_l)
  r_r = pc.mm(jnp.swapaxes(right.vectors, -1, -2), b.q_r)
  return _Block(
      mu=pc.mm(pc.mm(r_l, b.mu), jnp.swapaxes(r_r, -1, -2)),
      nu=pc.permute(b.nu, left.order, right.order),
      s_l=pc.change_basis(b.s_l, b.q_l, left.vectors),
      s_r=pc.change_basis(b.s_r, b.q_r, right.vectors),
      q_l=left.vectors, q_r=right.vectors)


def _blocked(cfg: pc.Settings, count, ages, lay: pc.Layout, blocks, mu, nu,
             s_l, s_r, q_l, q_r):
  """One parameter's blocks: the direction and the new state."""
  b = _Block(mu, nu, s_l, s_r, pc.rectify(q_l, cfg.rectify_steps),
             pc.rectify(q_r, cfg.rectify_steps))
  g_rot = pc.rotate(blocks, b.q_l, b.q_r)
  s_l, s_r = pc.update_stats(b.s_l, b.s_r, g_rot, cfg.beta)
  b = b._replace(s_l=s_l, s_r=s_r)
  changed = pc.is_refresh(count, cfg.frequency)

  def refresh(x):
    x = jax.lax.cond(count == 0, functools.partial(_first_basis, lay=lay),
                     functools.partial(_power_basis, lay=lay), x)
    return x, pc.rotate(blocks, x.q_l, x.q_r)

  # Between refreshes the gradient is rotated once, for both uses.
  refreshed, g_rot = jax.lax.cond(changed, refresh, lambda x: (x, g_rot), b)
  direction, mu, nu = _adam(cfg, count, ages, g_rot, refreshed.mu,
                            refreshed.nu)
  direction = pc.unrotate(direction, refreshed.q_l, refreshed.q_r)
  # The stored bases change only at a refresh: a decoded basis is stored
  # back as it was decoded, so its codes do not drift.
  return (direction, mu, nu, refreshed.s_l, refreshed.s_r,
          jnp.where(changed, refreshed.q_l, q_l),
          jnp.where(changed, refreshed.q_r, q_r))


def _matrix(cfg: pc.Settings, count, ages, g, *state):
  """One parameter of rank >= 2: its update and new state."""
  lay = pc.layout(g.shape, cfg.max_dim)
  blocks = pc.to_blocks(g, lay)
  out = _blocked(cfg, count, ages, lay, blocks, *pc.aligned(blocks, *state))
  return (pc.from_blocks(out[0], lay, g),
          *pc.restored(list(out[1:]), list(state)))


def _adam(cfg: pc.Settings, count, ages, g, mu, nu):
  """Adam's direction and moments; the first update only sets up the
  bases (its rotated gradient is diagonal up to rounding, and Adam's first
  step would follow the signs of that rounding), as in Vyas et al."""
  age_mu, age_nu = ages
  first = count == 0
  new_mu = jnp.where(first, mu, pc.ema(mu, g, cfg.b1))
  new_nu = jnp.where(first, nu, pc.ema(nu, g * g, cfg.b2))
  direction = pc.adam_direction(
      pc.debias(new_mu, cfg.b1, jnp.maximum(age_mu, 1)),
      pc.debias(new_nu, cfg.b2, jnp.maximum(age_nu, 1)), cfg.eps)
  return jnp.where(first, 0.0, direction), new_mu, new_nu


def _vector(cfg: pc.Settings, count, ages, g, mu, nu):
  """A parameter of rank < 2: Adam (on a mesh with Explicit axes, its
  moments computed sharded as the gradient and stored as they were)."""
  direction, new_mu, new_nu = _adam(cfg, count, ages, g,
                                    explicit.like(mu, g), explicit.like(nu, g))
  return (direction, *pc.restored([new_mu, new_nu], [mu, nu]))


def _update(cfg: pc.Settings, updates, state, params=None):
  del params
  state = pc.as_float32(state)
  # The first update moves nothing, and the moments' ages stay 0.
  moved = (state.count > 0).astype(jnp.int32)
  age_mu, age_nu = state.count_mu + moved, state.count_nu + moved

  def leaf(g, mu, nu, s_l, s_r, q_l, q_r):
    g = g.astype(jnp.float32)
    if pc.is_masked(s_l):
      return _vector(cfg, state.count, (age_mu, age_nu), g, mu, nu) + (
          s_l, s_r, q_l, q_r)
    return _matrix(cfg, state.count, (age_mu, age_nu), g, mu, nu, s_l, s_r,
                   q_l, q_r)

  out = jax.tree.map(leaf, updates, state.mu, state.nu, state.stats_l,
                     state.stats_r, state.eigvecs_l, state.eigvecs_r)
  parts = pc.unzip(jax.tree.structure(updates), out, updates)
  return parts[0], ScaleBySoapState(
      count=optax.safe_increment(state.count), mu=parts[1], nu=parts[2],
      stats_l=parts[3], stats_r=parts[4], eigvecs_l=parts[5],
      eigvecs_r=parts[6], count_mu=age_mu, count_nu=age_nu,
      count_stats_l=optax.safe_increment(state.count_stats_l),
      count_stats_r=optax.safe_increment(state.count_stats_r))


def scale_by_soap(
    b1: jax.typing.ArrayLike = 0.95,
    b2: jax.typing.ArrayLike = 0.95,
    eps: jax.typing.ArrayLike = 1e-8,
    *,
    max_preconditioner_dim: int | None = None,
    precondition_frequency: int | None = None,
    shampoo_beta: jax.typing.ArrayLike | None = None,
    rectify_steps: int = 0,
) -> optax.GradientTransformation:
  r"""SOAP: Adam run in the eigenbasis of Shampoo's factor statistics.

  For a parameter of rank >= 2, read as a matrix and cut into blocks as in
  [`optax_q.scale_by_shampoo`][optax_q.scale_by_shampoo], each block keeps
  the factor statistics `L, R` and orthogonal bases `Q_L, Q_R`, and runs
  Adam on the rotated gradient, rotating the result back. For a block
  `G_t` of the gradient a step computes (`G_t'^{\,2}` elementwise)

  ```tex
  L_t = \beta L_{t-1} + (1 - \beta) G_t G_t^\top, \qquad
  R_t = \beta R_{t-1} + (1 - \beta) G_t^\top G_t, \qquad
  G'_t = Q_L^\top G_t Q_R,
  \\
  m_t = \beta_1 m_{t-1} + (1 - \beta_1) G'_t, \qquad
  v_t = \beta_2 v_{t-1} + (1 - \beta_2) G_t'^{\,2},
  \\
  u_t = Q_L \left(\frac{m_t / (1 - \beta_1^{k_m})}
    {\sqrt{v_t / (1 - \beta_2^{k_v})} + \epsilon}\right) Q_R^\top,
  ```

  with `\beta` = ``shampoo_beta`` and `k` each moment's local age
  (updates since its last reset, the first update not counted). Every
  ``precondition_frequency`` updates (the first included) the bases are
  refreshed after the statistics take `G_t` and before the moments do:
  the first time as the eigenvectors of `L_1` and `R_1`, later by one QR
  power iteration on the columns sorted by their estimated eigenvalues
  `\mathrm{diag}(Q^\top L_t Q)` (the permutation `\pi`, largest `\lambda_1`),
  with the first moment rotated into the new bases `Q'` exactly and the
  second permuted with their columns (Vyas et al., Algorithm 4):

  ```tex
  Q'_L = \mathrm{qr}\big((L_t + 10^{-4} \lambda_1 I)\, Q_L P_L\big),
  \qquad
  m_{t-1} \leftarrow Q_L'^\top Q_L\, m_{t-1}\, Q_R^\top Q'_R, \qquad
  (v_{t-1})_{ij} \leftarrow (v_{t-1})_{\pi_L(i)\, \pi_R(j)},
  ```

  and `Q'_R` likewise from `R_t` (`P` is the permutation matrix of `\pi`;
  the small shift keeps a column of a zero eigenvalue where it is). The
  first update only sets up the bases: it returns zeros and leaves the
  moments as they are, as in the reference implementation. Parameters of
  rank < 2 take plain Adam (`Q_L = Q_R = I`), from the second update on.

  The statistics are held in the current basis (`Q_L^T L Q_L`),
  which a power iteration reads without forming `L`. A refresh whose
  statistic or result is not finite keeps that block's last good basis.

  Args:
    b1: EMA decay of the first moment, in [0, 1).
    b2: EMA decay of the second moment, in [0, 1).
    eps: Adam's epsilon, >= 0.
    max_preconditioner_dim: Largest block side, an int in [1, 65536];
      None: 1024.
    precondition_frequency: Updates between refreshes, an int >= 1; None:
      10. (None defaults stay static under ``optax.inject_hyperparams``.)
    shampoo_beta: EMA decay of the factor statistics, in [0, 1); None:
      ``b2``.
    rectify_steps: Björck iterations applied to the stored bases before
      use, in [0, 8]: 1 when they are stored quantized.

  Returns:
    A gradient transformation whose state is a
    [`ScaleBySoapState`][optax_q.ScaleBySoapState]; chain it with weight decay
    and a learning rate, or use [`optax_q.soap`][optax_q.soap].

  Raises:
    ValueError: at construction, naming the bad argument and the allowed
      values.

  Examples:
    >>> import jax.numpy as jnp, optax_q
    >>> tx = optax_q.scale_by_soap(max_preconditioner_dim=64)
    >>> state = tx.init({'w': jnp.zeros((64, 128)), 'b': jnp.zeros(128)})
    >>> state.mu['w'].shape, state.mu['b'].shape
    ((1, 2, 64, 64), (128,))
    >>> updates, state = tx.update({'w': jnp.ones((64, 128)),
    ...                             'b': jnp.ones(128)}, state)

  References:
    Vyas et al, [SOAP: Improving and Stabilizing Shampoo using
    Adam](https://arxiv.org/abs/2409.11321), 2024
  """
  cfg = pc.check_settings(
      b1=b1, b2=b2, eps=eps, shampoo_beta=shampoo_beta,
      max_preconditioner_dim=max_preconditioner_dim,
      precondition_frequency=(10 if precondition_frequency is None
                              else precondition_frequency), matrix_eps=1.0,
      rectify_steps=rectify_steps)
  return optax.GradientTransformation(
      functools.partial(_init, cfg), functools.partial(_update, cfg))

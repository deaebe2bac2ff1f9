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
"""Shampoo: blocked Kronecker-factored preconditioning with grafting.

``scale_by_shampoo`` is plain float32 arithmetic on a state whose every
statistic is a separate field, so that `optax_q.quantize_state` can
store each in its own format and `optax_q.reset_state` can reset
them; `optax_q.shampoo` puts the pieces together.
"""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

from optax_q._src.core import validation
from optax_q._src.second_order import preconditioner as pc

GRAFTINGS = ('adam', 'sgd', 'none')


class ScaleByShampooState(NamedTuple):
  """State of [`scale_by_shampoo`][optax_q.scale_by_shampoo].

  Matrix fields hold, for every parameter of rank >= 2, a stack
  ``(grid_rows, grid_cols, n, n)`` over its blocks (``optax.MaskedNode``
  for the other parameters).

  Attributes:
    count: Updates so far (int32); the bases refresh when it is a multiple
      of ``precondition_frequency``.
    mu: EMA of the gradients (``b1``), shaped like the parameters: the
      direction both Shampoo and the grafting precondition.
    nu: EMA of the squared gradients (``b2``) of Adam grafting
      (``MaskedNode`` leaves for other grafting types).
    stats_l: Left factor statistics ``Q_L^T EMA[G G^T] Q_L``, in the
      current eigenbasis.
    stats_r: Right factor statistics, likewise.
    eigvecs_l: Left eigenbases (orthogonal; columns by decreasing
      eigenvalue).
    eigvecs_r: Right eigenbases.
    eigvals_l: Bias-corrected left eigenvalues at the last refresh,
      ``(grid_rows, grid_cols, n)``.
    eigvals_r: Right eigenvalues, likewise.
    count_mu: Updates of ``mu`` since its last reset (its bias correction).
    count_nu: Updates of ``nu`` since its last reset.
    count_stats_l: Updates of ``stats_l`` since its last reset.
    count_stats_r: Updates of ``stats_r`` since its last reset.
  """

  count: jax.Array
  mu: optax.Updates
  nu: optax.Updates
  stats_l: Any
  stats_r: Any
  eigvecs_l: Any
  eigvecs_r: Any
  eigvals_l: Any
  eigvals_r: Any
  count_mu: jax.Array
  count_nu: jax.Array
  count_stats_l: jax.Array
  count_stats_r: jax.Array


def _init(cfg: pc.Settings, grafting: str, params) -> ScaleByShampooState:
  zeros = lambda: jax.tree.map(
      lambda p: jnp.zeros(p.shape, jnp.float32), params)
  values = lambda side: pc.matrix_tree(params, cfg.max_dim, lambda lay: (
      jnp.zeros(lay.stats_shape(side)[:-1], jnp.float32)))
  return ScaleByShampooState(
      mu=zeros(),
      nu=zeros() if grafting == 'adam' else jax.tree.map(
          lambda _: optax.MaskedNode(), params),
      eigvals_l=values('l'), eigvals_r=values('r'),
      **pc.initial_factors(params, cfg.max_dim))


class _Side(NamedTuple):
  """One side's statistic, stored basis, basis in use and eigenvalues."""

  stats: jax.Array
  stored: jax.Array
  basis: jax.Array
  values: jax.Array


def _refresh_side(side: _Side, pad, correction) -> _Side:
  eig = pc.eigh(side.stats, side.basis, pad)
  ok = eig.ok[..., None, None]
  return _Side(
      stats=jnp.where(ok, pc.diag_embed(eig.values), side.stats),
      stored=jnp.where(ok, eig.vectors, side.stored),
      basis=eig.vectors,
      values=jnp.where(eig.ok[..., None], eig.values / correction,
                       side.values))


def _blocked(cfg: pc.Settings, grafting: str, refresh, age_stats,
             lay: pc.Layout, blocks, m_blocks, t_blocks, s_l, s_r, q_l, q_r,
             v_l, v_r):
  """One parameter's blocks: the direction, new statistics and bases."""
  basis_l = pc.rectify(q_l, cfg.rectify_steps)
  basis_r = pc.rectify(q_r, cfg.rectify_steps)
  s_l, s_r = pc.update_stats(s_l, s_r, pc.rotate(blocks, basis_l, basis_r),
                             cfg.beta)
  correction = 1 - jnp.asarray(cfg.beta, jnp.float32) ** age_stats.astype(
      jnp.float32)
  left, right = jax.lax.cond(
      refresh,
      lambda l, r: (_refresh_side(l, lay.padding('l'), correction),
                    _refresh_side(r, lay.padding('r'), correction)),
      lambda l, r: (l, r),
      _Side(s_l, q_l, basis_l, v_l), _Side(s_r, q_r, basis_r, v_r))
  rotated = pc.rotate(m_blocks, left.basis, right.basis)
  scaled = (rotated * pc.inverse_root(left.values, cfg.matrix_eps)[..., :, None]
            * pc.inverse_root(right.values, cfg.matrix_eps)[..., None, :])
  direction = pc.unrotate(scaled, left.basis, right.basis)
  if grafting != 'none':
    direction = pc.graft(direction, t_blocks)
  return (direction, left.stats, right.stats, left.stored, right.stored,
          left.values, right.values)


def _matrix(cfg: pc.Settings, grafting: str, refresh, age_stats, g, mu_hat,
            target, *state):
  """One parameter of rank >= 2: its direction and new per-block state."""
  lay = pc.layout(g.shape, cfg.max_dim)
  blocks = pc.to_blocks(g, lay)
  # The moments' blocks on the gradient's grid: a state split over a mesh
  # axis the parameter does not use (ZeRO-1) decodes split over it too.
  out = _blocked(cfg, grafting, refresh, age_stats, lay, blocks,
                 *pc.aligned(blocks, pc.to_blocks(mu_hat, lay),
                             pc.to_blocks(target, lay)),
                 *pc.aligned(blocks, *state))
  return (pc.from_blocks(out[0], lay, g),
          *pc.restored(list(out[1:]), list(state)))


def _update(cfg: pc.Settings, grafting: str, updates, state, params=None):
  del params
  state = pc.as_float32(state)
  age_mu, age_nu, age_l, age_r = pc.ages(
      state.count_mu, state.count_nu, state.count_stats_l,
      state.count_stats_r)
  g = jax.tree.map(lambda x: x.astype(jnp.float32), updates)
  mu = jax.tree.map(lambda m, x: pc.ema(m, x, cfg.b1), state.mu, g)
  mu_hat = jax.tree.map(lambda m: pc.debias(m, cfg.b1, age_mu), mu)
  nu, target = state.nu, mu_hat
  if grafting == 'adam':
    nu = jax.tree.map(lambda v, x: pc.ema(v, x * x, cfg.b2), state.nu, g)
    target = jax.tree.map(
        lambda m, v: pc.adam_direction(m, pc.debias(v, cfg.b2, age_nu),
                                       cfg.eps), mu_hat, nu)
  refresh = pc.is_refresh(state.count, cfg.frequency)

  def leaf(x, m, t, s_l, *rest):
    if pc.is_masked(s_l):
      return (t, s_l) + rest
    return _matrix(cfg, grafting, refresh, age_l, x, m, t, s_l, *rest)

  out = jax.tree.map(
      leaf, g, mu_hat, target, state.stats_l, state.stats_r,
      state.eigvecs_l, state.eigvecs_r, state.eigvals_l, state.eigvals_r,
      is_leaf=pc.is_masked)
  parts = pc.unzip(jax.tree.structure(g, is_leaf=pc.is_masked), out,
                   updates)
  return parts[0], ScaleByShampooState(
      count=optax.safe_increment(state.count), mu=mu, nu=nu,
      stats_l=parts[1], stats_r=parts[2], eigvecs_l=parts[3],
      eigvecs_r=parts[4], eigvals_l=parts[5], eigvals_r=parts[6],
      count_mu=age_mu, count_nu=age_nu, count_stats_l=age_l,
      count_stats_r=age_r)


def scale_by_shampoo(
    b1: jax.typing.ArrayLike = 0.9,
    b2: jax.typing.ArrayLike = 0.999,
    eps: jax.typing.ArrayLike = 1e-8,
    *,
    max_preconditioner_dim: int | None = None,
    precondition_frequency: int | None = None,
    shampoo_beta: jax.typing.ArrayLike | None = None,
    matrix_eps: float = 1e-6,
    grafting: str = 'adam',
    rectify_steps: int = 0,
) -> optax.GradientTransformation:
  r"""Shampoo's preconditioned direction, grafted to Adam's norm.

  For a parameter of rank >= 2, read as a matrix (see below) and cut into
  blocks of at most ``max_preconditioner_dim`` rows and columns, a step
  computes for each block `G_t` of the gradient (`G_t^2` elementwise):

  ```tex
  m_t = \beta_1 m_{t-1} + (1 - \beta_1) G_t, \qquad
  v_t = \beta_2 v_{t-1} + (1 - \beta_2) G_t^2, \qquad
  \hat m_t = \frac{m_t}{1 - \beta_1^{k_m}}, \quad
  \hat v_t = \frac{v_t}{1 - \beta_2^{k_v}},
  \\
  L_t = \beta L_{t-1} + (1 - \beta) G_t G_t^\top, \qquad
  R_t = \beta R_{t-1} + (1 - \beta) G_t^\top G_t,
  \\
  P_t = Q_L \big(\Lambda_L + \delta \lambda_{\max}(\Lambda_L)\big)^{-1/4}
    Q_L^\top \, \hat m_t \,
    Q_R \big(\Lambda_R + \delta \lambda_{\max}(\Lambda_R)\big)^{-1/4}
    Q_R^\top,
  \\
  u_t = \frac{\|A_t\|_F}{\|P_t\|_F}\, P_t, \qquad
  A_t = \frac{\hat m_t}{\sqrt{\hat v_t} + \epsilon}
  \ (\texttt{'adam'}), \quad \hat m_t\ (\texttt{'sgd'}),
  ```

  with `\beta` = ``shampoo_beta``, `\delta` = ``matrix_eps``, `k` each
  field's local age (updates since its last reset: the step count when
  nothing resets it), and

  ```tex
  Q_L \Lambda_L Q_L^\top = \frac{L_t}{1 - \beta^{k_S}}, \qquad
  Q_R \Lambda_R Q_R^\top = \frac{R_t}{1 - \beta^{k_S}}
  ```

  the eigendecompositions (columns by decreasing eigenvalue) taken at
  every ``precondition_frequency``-th update (the first update included),
  after the statistics take `G_t`, and kept in between. `u_t` takes each
  block of `P_t` to the norm of the same block of the grafting direction
  `A_t` (``'none'``: `u_t = P_t`). A side whose eigenvalues were all zero
  at the last refresh (only zero gradients so far) has the identity for
  its factor, and a refresh whose statistic or result is not finite keeps
  that block's last good `Q, \Lambda`. Parameters of rank < 2 (and
  matrices with one row or one column) take `u_t = A_t`: with ``'sgd'``
  and ``'none'`` that is `\hat m_t`, a step that scales with the gradients
  while the preconditioned ones do not.

  The statistics are held in the current eigenbasis
  (`Q_L^T L Q_L`, diagonal right after a refresh), so that a
  quantized statistic keeps each eigen-direction to its own relative
  precision (see ``optax_q/_src/second_order/preconditioner.py``).

  A parameter of rank > 2 is read as the matrix whose rows are its leading
  axes and whose columns are the others, split where the two are most
  nearly equal (a ``(128, 4, 32)`` kernel is ``128 x 128``). Gradients are
  clipped to `2^{55}` inside the statistics, so that finite gradients
  never give non-finite ones.

  Args:
    b1: EMA decay of the gradients, in [0, 1).
    b2: EMA decay of Adam grafting's squared gradients, in [0, 1).
    eps: Adam grafting's epsilon, >= 0.
    max_preconditioner_dim: Largest block side, an int in [1, 65536];
      None: 1024.
    precondition_frequency: Updates between refreshes, an int >= 1; None:
      20. (None defaults stay static under ``optax.inject_hyperparams``.)
    shampoo_beta: EMA decay of the factor statistics, in [0, 1); None:
      ``b2``.
    matrix_eps: Added to the eigenvalues before the inverse root, relative
      to the block's largest, in (0, 1].
    grafting: ``'adam'``, ``'sgd'`` or ``'none'``.
    rectify_steps: Björck iterations applied to the stored eigenbases
      before use, in [0, 8]: 1 when they are stored quantized.

  Returns:
    A gradient transformation whose state is a
    [`ScaleByShampooState`][optax_q.ScaleByShampooState]; chain it with weight
    decay and a learning rate, or use [`optax_q.shampoo`][optax_q.shampoo].

  Raises:
    ValueError: at construction, naming the bad argument and the allowed
      values.

  Examples:
    >>> import jax.numpy as jnp, optax_q
    >>> tx = optax_q.scale_by_shampoo(max_preconditioner_dim=64)
    >>> state = tx.init({'w': jnp.zeros((64, 128)), 'b': jnp.zeros(128)})
    >>> state.stats_r['w'].shape  # Two blocks of 64 x 64, their R factors.
    (1, 2, 64, 64)
    >>> updates, state = tx.update({'w': jnp.ones((64, 128)),
    ...                             'b': jnp.ones(128)}, state)

  References:
    Gupta et al, [Shampoo: Preconditioned Stochastic Tensor
    Optimization](https://arxiv.org/abs/1802.09568), 2018

    Shi et al, [A Distributed Data-Parallel PyTorch Implementation of the
    Distributed Shampoo Optimizer](https://arxiv.org/abs/2309.06497), 2023

    Wang et al, [4-bit Shampoo for Memory-Efficient Network
    Training](https://arxiv.org/abs/2405.18144), 2024
  """
  cfg = pc.check_settings(
      b1=b1, b2=b2, eps=eps, shampoo_beta=shampoo_beta,
      max_preconditioner_dim=max_preconditioner_dim,
      precondition_frequency=(20 if precondition_frequency is None
                              else precondition_frequency), matrix_eps=matrix_eps,
      rectify_steps=rectify_steps)
  grafting = validation.check_choice(grafting, 'grafting', GRAFTINGS)
  return optax.GradientTransformation(
      functools.partial(_init, cfg, grafting),
      functools.partial(_update, cfg, grafting))

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
"""Blocked Kronecker-factor statistics and their eigenbases.

What `optax_q.scale_by_shampoo` and `optax_q.scale_by_soap`
share. A parameter of rank >= 2 is read as a matrix (its axes split where
rows and columns are most nearly equal: a ``(128, 4, 32)`` attention kernel
is ``128 x 128``), cut into blocks of at most ``block_size`` rows and
columns (the last ones padded with zeros) and held as a stack of shape
``(grid_rows, grid_cols, rows, cols)``, so that a parameter's sharding over
its columns shards its blocks.

Each block has a left and a right factor statistic, ``L = EMA[G G^T]`` and
``R = EMA[G^T G]``, held **in the block's current eigenbasis**:
``S_L = Q_L^T L Q_L``. With ``G' = Q_L^T G Q_R``, the update is
``S_L <- beta S_L + (1 - beta) G' G'^T`` (``Q_R`` is orthogonal), the
rotated gradient both optimizers need anyway. Right after a refresh
``S_L`` is diagonal (the eigenvalues), and between refreshes its diagonal
dominates, so a quantized statistic with one scale per row keeps each
eigen-direction to its own relative precision: the small eigenvalues that
set an inverse root are not rounded against the largest ones. This is the
precaution 4-bit Shampoo (Wang et al., 2024) takes by quantizing
eigenvectors and keeping eigenvalues, carried over to a statistic that is
updated every step.

Padded rows and columns are held apart: their statistics are exactly zero,
and every decomposition marks them with a negative eigenvalue, so their
basis vectors stay unit vectors and never mix with the block's own null
space (a padded block computes what an unpadded one of the true size
would). A refresh whose statistic (or whose result) is not finite keeps the
block's last good basis.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from optax_q._src.core import explicit
from optax_q._src.core import validation

HIGHEST = jax.lax.Precision.HIGHEST

# Rotated gradients are clipped to this magnitude before their outer
# products, so that finite gradients never give non-finite statistics: a
# block of up to 2**16 rows then sums to at most float32's largest value.
GRADIENT_BOUND = 2.0**55
DEFAULT_MAX_DIM = 1024
# An eigenvalue (estimate) at most this fraction of its block's largest is
# zero to float32 rounding: an eigensolver's error on a block of side n is
# about n * 6e-8 of the largest eigenvalue (6e-5 at n = 1024).
NULL_RTOL = 1e-4
POWER_SHIFT = 1e-4


class Layout(NamedTuple):
  """How a parameter is read as blocks (static)."""

  shape: tuple[int, ...]
  rows: int
  cols: int
  block_rows: int
  block_cols: int
  grid_rows: int
  grid_cols: int

  @property
  def blocks_shape(self) -> tuple[int, int, int, int]:
    return (self.grid_rows, self.grid_cols, self.block_rows, self.block_cols)

  def stats_shape(self, side: str) -> tuple[int, int, int, int]:
    n = self.block_rows if side == 'l' else self.block_cols
    return (self.grid_rows, self.grid_cols, n, n)

  def padding(self, side: str) -> np.ndarray:
    """Bool ``(grid_rows, 1, n)`` (left) or ``(1, grid_cols, n)`` (right):
    which coordinates of each block are padding."""
    if side == 'l':
      idx = np.arange(self.grid_rows)[:, None] * self.block_rows + np.arange(
          self.block_rows)[None, :]
      return (idx >= self.rows)[:, None, :]
    idx = np.arange(self.grid_cols)[:, None] * self.block_cols + np.arange(
        self.block_cols)[None, :]
    return (idx >= self.cols)[None, :, :]


def layout(shape, block_size: int) -> Layout | None:
  """The block layout of a parameter of ``shape``; None below rank 2 and
  for a matrix with one row or one column (taken as a vector).

  The axes are split into rows and columns where the two products are most
  nearly equal (ties: the earlier split).
  """
  shape = tuple(int(d) for d in shape)
  if len(shape) < 2 or 0 in shape:
    return None
  best = min(range(1, len(shape)), key=lambda k: abs(
      math.log(math.prod(shape[:k])) - math.log(math.prod(shape[k:]))))
  rows, cols = math.prod(shape[:best]), math.prod(shape[best:])
  if min(rows, cols) == 1:  # A vector in disguise: its factor is a scalar.
    return None
  br, bc = min(rows, block_size), min(cols, block_size)
  return Layout(shape, rows, cols, br, bc, -(-rows // br), -(-cols // bc))


def _grid_spec(x: jax.Array, lay: Layout) -> tuple[Any, Any] | None:
  """On a mesh with Explicit axes, the mesh axes ``(rows, cols)`` that the
  block grid of ``x`` keeps: a matrix axis whose blocks fall inside its
  shards (no padding, a grid the axes divide); None on other meshes."""
  spec = explicit.spec_of(x)
  if spec is None:
    return None
  if len(lay.shape) != 2:
    return (None, None)
  mesh = explicit.sharding_of(x).mesh

  def keep(axes, grid, n, block):
    fits = grid * block == n and grid % explicit.axes_size(mesh, axes) == 0
    return axes if fits else None

  return (keep(spec[0], lay.grid_rows, lay.rows, lay.block_rows),
          keep(spec[1], lay.grid_cols, lay.cols, lay.block_cols))


def to_blocks(x: jax.Array, lay: Layout) -> jax.Array:
  """``x`` as a ``(grid_rows, grid_cols, rows, cols)`` stack, zero-padded.

  On a mesh with Explicit axes the stack is sharded over its grid as ``x``
  is over its rows and columns, where the blocks fall inside the shards,
  and replicated along the other axes.
  """
  grid = _grid_spec(x, lay)
  if grid is not None:
    x = explicit.reshard(x, explicit.with_spec(
        x, grid if x.ndim == 2 else (None,) * x.ndim))
    if grid == (None, None):  # Gathered whole: no sharding to carry.
      grid = None
  x = x.reshape(lay.rows, lay.cols)
  x = jnp.pad(x, ((0, lay.grid_rows * lay.block_rows - lay.rows),
                  (0, lay.grid_cols * lay.block_cols - lay.cols)))
  shape = (lay.grid_rows, lay.block_rows, lay.grid_cols, lay.block_cols)
  if grid is None:
    x = x.reshape(shape)
  else:
    x = jax.lax.reshape(x, shape, out_sharding=explicit.with_spec(
        x, (grid[0], None, grid[1], None)))
  return x.transpose(0, 2, 1, 3)


def from_blocks(b: jax.Array, lay: Layout, like: jax.Array) -> jax.Array:
  """The inverse of `to_blocks` (padding dropped), sharded as
  ``like`` (the parameter's gradient)."""
  x = b.transpose(0, 2, 1, 3)
  shape = (lay.grid_rows * lay.block_rows, lay.grid_cols * lay.block_cols)
  grid = _grid_spec(like, lay)
  if grid is None:
    x = x.reshape(shape)
  else:
    x = jax.lax.reshape(x, shape,
                        out_sharding=explicit.with_spec(like, grid))
  x = x[:lay.rows, :lay.cols].reshape(lay.shape)
  return explicit.reshard(x, explicit.sharding_of(like))


def aligned(blocks: jax.Array, *arrays: jax.Array) -> list[jax.Array]:
  """``arrays`` (per-block state, ``(grid_rows, grid_cols, ...)``) sharded
  over the grid as ``blocks`` is, on a mesh with Explicit axes."""
  sharding = explicit.type_sharding(blocks)
  if sharding is None:
    return list(arrays)
  grid = tuple(sharding.spec)[:2]
  grid += (None,) * (2 - len(grid))
  return [explicit.reshard(a, sharding.update(spec=jax.sharding.PartitionSpec(
      *grid, *(None,) * (a.ndim - 2)))) for a in arrays]


def restored(new: list[jax.Array], old: list[jax.Array]) -> list[jax.Array]:
  """``new`` per-block state sharded as the ``old`` it replaces."""
  return [explicit.like(n, o) for n, o in zip(new, old)]


def eye_stack(shape) -> jax.Array:
  """Identity matrices of ``shape = (..., n, n)``."""
  return jnp.broadcast_to(jnp.eye(shape[-1], dtype=jnp.float32), shape)


def _t(a: jax.Array) -> jax.Array:
  return jnp.swapaxes(a, -1, -2)


def mm(a: jax.Array, b: jax.Array) -> jax.Array:
  """A float32 batched matmul at full precision (no TF32 or bf16 passes)."""
  return jnp.matmul(a, b, precision=HIGHEST)


def rotate(g: jax.Array, q_l: jax.Array, q_r: jax.Array) -> jax.Array:
  """``Q_L^T G Q_R``: blocks into the eigenbasis."""
  return mm(mm(_t(q_l), g), q_r)


def unrotate(g: jax.Array, q_l: jax.Array, q_r: jax.Array) -> jax.Array:
  """``Q_L G Q_R^T``: blocks back from the eigenbasis."""
  return mm(mm(q_l, g), _t(q_r))


def rectify(q: jax.Array, steps: int) -> jax.Array:
  """``steps`` Björck iterations ``Q <- Q (3 I - Q^T Q) / 2``.

  Brings a decoded (quantized) basis back to orthogonal: each iteration
  squares the distance ``|Q^T Q - I|`` (4-bit Shampoo, Wang et al., 2024).
  """
  for _ in range(steps):
    q = mm(q, 1.5 * eye_stack(q.shape) - 0.5 * mm(_t(q), q))
  return q


def update_stats(s_l: jax.Array, s_r: jax.Array, g_rot: jax.Array,
                 beta: jax.Array) -> tuple[jax.Array, jax.Array]:
  """The rotated factor EMAs after one more rotated gradient."""
  g = jnp.clip(g_rot, -GRADIENT_BOUND, GRADIENT_BOUND)
  return (beta * s_l + (1 - beta) * mm(g, _t(g)),
          beta * s_r + (1 - beta) * mm(_t(g), g))


def _finite(x: jax.Array) -> jax.Array:
  """Whether each matrix of a ``(..., n, m)`` stack is finite."""
  return jnp.all(jnp.isfinite(x), axis=(-2, -1))


def _marked(mat: jax.Array, pad: np.ndarray) -> jax.Array:
  """``mat`` with padded rows and columns zeroed and a negative diagonal
  there (below every eigenvalue of the block's own part)."""
  keep = ~pad[..., :, None] & ~pad[..., None, :]
  mat = jnp.where(keep, mat, 0.0)
  low = -1.0 - jnp.max(jnp.abs(jnp.diagonal(mat, axis1=-2, axis2=-1)),
                       axis=-1, keepdims=True)
  return mat + (jnp.where(pad, low, 0.0)[..., None, :]
                * eye_stack(mat.shape))


def one_block_at_a_time(fn, stack: jax.Array):
  """``fn`` (a LAPACK decomposition) over a ``(..., n, n)`` stack, one
  matrix per call.

  Batched LAPACK calls on CPU split their batch over XLA's intra-op
  threads and wait for it there; two of them running side by side (the
  left and right factors, or two parameters) can then each hold a thread
  waiting for the other, a deadlock on a 2-core machine. One matrix per
  call never waits.
  """
  sharding = explicit.sharding_of(stack)
  if sharding is not None:  # lax.map takes no sharded axis: gather it.
    stack = jax.sharding.reshard(stack, sharding.update(
        spec=jax.sharding.PartitionSpec()))
  flat = stack.reshape((-1,) + stack.shape[-2:])
  out = jax.lax.map(fn, flat)
  out = jax.tree.map(
      lambda y: y.reshape(stack.shape[:-2] + y.shape[1:]), out)
  if sharding is None:
    return out
  return jax.tree.map(lambda y: explicit.reshard(y, sharding.update(
      spec=tuple(sharding.spec)[:y.ndim])), out)


class Eigen(NamedTuple):
  """A refreshed block basis: eigenvectors (columns, largest eigenvalue
  first), eigenvalues (padding: 0) and whether each block refreshed."""

  vectors: jax.Array
  values: jax.Array
  ok: jax.Array


def null_directions(values: jax.Array, pad: np.ndarray) -> jax.Array:
  """Which of a block's own coordinates have an eigenvalue (estimate) of
  zero to float32 rounding: at most `NULL_RTOL` of the block's largest."""
  top = jnp.max(jnp.where(pad, 0.0, values), axis=-1, keepdims=True)
  return ~pad & (values <= NULL_RTOL * top)


def _canonical_null(vectors: jax.Array, null: jax.Array, pad: np.ndarray
                    ) -> jax.Array:
  """``vectors`` with their null columns (a contiguous run after the
  block's other columns, before its padding) replaced by one basis of the
  same subspace that depends on the subspace alone: the eigenvectors of
  the coordinate ramp ``D = diag(1..n) / n`` compressed to it,
  ``N^T D N``. The other columns are kept as they are."""
  n = vectors.shape[-1]
  idx = jnp.arange(n)
  ramp = (idx + 1).astype(jnp.float32) / n
  compressed = mm(_t(vectors) * ramp, vectors)
  # Keys that keep every other column in its place: below the compressed
  # ramp's eigenvalues (in (0, 1]) for the leading columns, above for the
  # padding.
  key = jnp.where(pad, idx + 2.0 * n, idx - 2.0 * n)
  both = null[..., :, None] & null[..., None, :]
  mat = jnp.where(both, compressed, 0.0) + diag_embed(
      jnp.where(null, 0.0, key))

  def rotation(a):
    has_null = jnp.any(jnp.abs(jnp.diagonal(a)) <= 1.0)
    return jax.lax.cond(has_null, lambda a: jnp.linalg.eigh(a)[1],
                        lambda a: jnp.eye(n, dtype=a.dtype), a)

  turned = mm(vectors, one_block_at_a_time(rotation, mat))
  return jnp.where(null[..., None, :], turned, vectors)


def eigh(s: jax.Array, q: jax.Array, pad: np.ndarray, *,
         canonical_null: bool = False) -> Eigen:
  """Eigenbasis of ``L = Q S Q^T`` per block, guarded.

  A block whose ``L`` (or whose result) is not finite keeps ``q`` (its
  eigenvalues are then meaningless and must be ignored by the caller).

  The eigenvectors of a zero eigenvalue (a statistic of fewer gradient
  rows than its side, as a short or ragged block's first ones) are any
  basis of the null space, picked by rounding: two runs whose statistics
  differ in their last bits (a sharded and an unsharded one) pick unrelated
  bases. A rotation-invariant use (Shampoo's inverse root, equal on the
  whole null space) does not care; Adam in the basis (SOAP) normalizes
  each coordinate and does. ``canonical_null`` replaces them by one basis
  that depends on the null space alone (see `_canonical_null`), and gives
  them eigenvalue 0.
  """
  full = mm(mm(q, s), _t(q))
  full = _marked(0.5 * (full + _t(full)), pad)
  ok = _finite(full)
  values, vectors = one_block_at_a_time(jnp.linalg.eigh, jnp.where(
      ok[..., None, None], full, eye_stack(full.shape)))
  values, vectors = values[..., ::-1], vectors[..., ::-1]
  ok = ok & _finite(vectors) & jnp.all(jnp.isfinite(values), axis=-1)
  values = jnp.where(pad, 0.0, jnp.maximum(values, 0.0))
  if canonical_null:
    null = null_directions(values, pad)
    vectors = _canonical_null(vectors, null, pad)
    values = jnp.where(null, 0.0, values)
    ok = ok & _finite(vectors)
  return Eigen(jnp.where(ok[..., None, None], vectors, q),
               jnp.where(ok[..., None], values, 0.0), ok)


class PowerStep(NamedTuple):
  """A basis after one QR power iteration: the new basis, the column
  order applied before it (SOAP sorts by estimated eigenvalue), and
  whether each block refreshed."""

  vectors: jax.Array
  order: jax.Array
  ok: jax.Array


def power_qr(s: jax.Array, q: jax.Array, pad: np.ndarray) -> PowerStep:
  """One power iteration ``Q' = qr(L Q)`` on the columns of ``Q`` sorted
  by their estimated eigenvalues ``diag(S)`` (Vyas et al., 2024).

  With ``S = Q^T L Q``, ``L Q P = Q P (P^T S P)`` for the permutation
  ``P``, so no full statistic is formed. Padded columns stay last, as unit
  vectors. A column whose estimate is zero to rounding (`null_directions`)
  is kept, orthogonalized against the others, rather than replaced by
  ``L q``, which is rounding noise in a direction rounding picks (see
  `eigh`). A block that is not finite keeps ``q`` in its order.
  """
  est = jnp.where(pad, -jnp.inf, jnp.diagonal(s, axis1=-2, axis2=-1))
  order = jnp.argsort(-est, axis=-1, stable=True)
  q_p = jnp.take_along_axis(q, order[..., None, :], axis=-1)
  s_p = jnp.take_along_axis(
      jnp.take_along_axis(s, order[..., :, None], axis=-2),
      order[..., None, :], axis=-1)
  power = mm(q_p, s_p)
  pad_cols = jnp.take_along_axis(jnp.broadcast_to(pad, order.shape), order,
                                 axis=-1)
  top = jnp.max(jnp.where(pad_cols, 0.0, jnp.take_along_axis(
      est, order, axis=-1)), axis=-1, keepdims=True)
  power = power + (POWER_SHIFT * top)[..., None, :] * q_p
  power = jnp.where(pad_cols[..., None, :], -q_p, power)
  ok = _finite(power)
  vectors = one_block_at_a_time(
      lambda a: jnp.linalg.qr(a)[0],
      jnp.where(ok[..., None, None], power, q_p))
  ok = ok & _finite(vectors)
  identity = jnp.broadcast_to(jnp.arange(order.shape[-1]), order.shape)
  return PowerStep(jnp.where(ok[..., None, None], vectors, q),
                   jnp.where(ok[..., None], order, identity), ok)


def change_basis(s: jax.Array, old: jax.Array, new: jax.Array) -> jax.Array:
  """A statistic held in basis ``old`` expressed in basis ``new``."""
  r = mm(_t(new), old)
  return mm(mm(r, s), _t(r))


def inverse_root(values: jax.Array, eps: float, root: int = 4) -> jax.Array:
  """``(lambda + eps * max lambda)^(-1/root)`` per block (``lambda >= 0``).

  ``eps`` is relative to the block's largest eigenvalue, so the scale of a
  statistic (and its bias correction) does not change the direction; the
  floor keeps the null space finite, and a block whose statistic is zero
  (only zero gradients so far) is not preconditioned.
  """
  top = jnp.max(values, axis=-1, keepdims=True)
  floor = jnp.maximum(eps * top, jnp.finfo(jnp.float32).tiny)
  # A block that has seen only zero gradients: no preconditioning.
  return jnp.where(top > 0, jnp.power(values + floor, -1.0 / root), 1.0)


def block_norms(x: jax.Array) -> jax.Array:
  """The Frobenius norm of every block of a stack, ``(..., 1, 1)``."""
  return jnp.sqrt(jnp.sum(jnp.square(x), axis=(-2, -1), keepdims=True))


def graft(direction: jax.Array, target: jax.Array) -> jax.Array:
  """``direction`` rescaled, block by block, to the norm of ``target``."""
  norm = block_norms(direction)
  ratio = jnp.where(norm > 0, block_norms(target) / jnp.where(
      norm > 0, norm, 1.0), 0.0)
  return direction * ratio


def matrix_tree(params, max_dim: int, fn):
  """``fn(layout)`` for every parameter of rank >= 2, ``MaskedNode`` for
  the others (their statistics do not exist)."""
  def leaf(p):
    lay = layout(p.shape, max_dim)
    return optax.MaskedNode() if lay is None else fn(lay)

  return jax.tree.map(leaf, params)


def diag_embed(values: jax.Array) -> jax.Array:
  """Diagonal matrices from a ``(..., n)`` stack of their diagonals."""
  return values[..., :, None] * eye_stack(values.shape + values.shape[-1:])


def permute(x: jax.Array, order_l: jax.Array, order_r: jax.Array
            ) -> jax.Array:
  """Rows of every block taken in ``order_l``, columns in ``order_r``."""
  x = jnp.take_along_axis(x, order_l[..., :, None], axis=-2)
  return jnp.take_along_axis(x, order_r[..., None, :], axis=-1)


# -----------------------------------------------------------------------------
# What both transforms take and keep.
# -----------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Settings:
  """The checked hyperparameters of a Shampoo or SOAP transform."""

  b1: Any
  b2: Any
  eps: Any
  beta: Any  # The factor statistics' EMA decay.
  max_dim: int
  frequency: int
  matrix_eps: float
  rectify_steps: int


def check_settings(*, b1, b2, eps, shampoo_beta, max_preconditioner_dim,
                   precondition_frequency, matrix_eps, rectify_steps
                   ) -> Settings:
  """Checks the arguments both transforms take (a ValueError names the bad
  one and the allowed values)."""
  b1 = validation.check_number(b1, 'b1', high=1.0)
  b2 = validation.check_number(b2, 'b2', high=1.0)
  beta = b2 if shampoo_beta is None else validation.check_number(
      shampoo_beta, 'shampoo_beta', high=1.0)
  return Settings(
      b1=b1, b2=b2, eps=validation.check_number(eps, 'eps'), beta=beta,
      max_dim=validation.check_int(
          DEFAULT_MAX_DIM if max_preconditioner_dim is None
          else max_preconditioner_dim, 'max_preconditioner_dim', low=1,
          high=2**16, hint=validation.STATIC_HINT),
      frequency=validation.check_int(
          precondition_frequency, 'precondition_frequency', low=1,
          high=2**31 - 1, hint=validation.STATIC_HINT),
      matrix_eps=validation.check_number(
          matrix_eps, 'matrix_eps', high=1.0, closed='(]'),
      rectify_steps=validation.check_int(rectify_steps, 'rectify_steps',
                                         high=8))


def ema(moment: jax.Array, x: jax.Array, decay: Any) -> jax.Array:
  return decay * moment + (1 - decay) * x


def debias(moment: jax.Array, decay: Any, age: jax.Array) -> jax.Array:
  """``moment / (1 - decay**age)`` (``age`` >= 1: updates since reset)."""
  return moment / (1 - jnp.asarray(decay, jnp.float32)
                   ** age.astype(jnp.float32))


def adam_direction(mu_hat: jax.Array, nu_hat: jax.Array, eps: Any
                   ) -> jax.Array:
  return mu_hat / (jnp.sqrt(nu_hat) + eps)


def ages(*counts: jax.Array) -> tuple[jax.Array, ...]:
  """Every local age advanced by this update."""
  return tuple(optax.safe_increment(c) for c in counts)


def initial_factors(params, max_dim: int) -> dict[str, Any]:
  """The state fields every blocked optimizer starts alike: zero factor
  statistics, identity bases, and zero count and local ages."""
  zero = lambda: jnp.zeros([], jnp.int32)
  stats = lambda side: matrix_tree(params, max_dim, lambda lay: jnp.zeros(
      lay.stats_shape(side), jnp.float32))
  eye = lambda side: matrix_tree(params, max_dim,
                                 lambda lay: eye_stack(lay.stats_shape(side)))
  return dict(
      count=zero(), stats_l=stats('l'), stats_r=stats('r'),
      eigvecs_l=eye('l'), eigvecs_r=eye('r'), count_mu=zero(),
      count_nu=zero(), count_stats_l=zero(), count_stats_r=zero())


def is_refresh(count: jax.Array, frequency: int) -> jax.Array:
  """Whether this update (0-based ``count``) refreshes the bases: the
  first, then every ``frequency``-th."""
  return count % frequency == 0


def as_float32(state: Any) -> Any:
  """``state`` (a NamedTuple) with every array but the counts in float32 (a
  stored state may decode to a narrower float, as bf16 does)."""
  return state._replace(**{
      f: jax.tree.map(lambda x: x.astype(jnp.float32), getattr(state, f))
      for f in state._fields if f[:5] != 'count'})


def unzip(treedef: Any, out: Any, updates: Any) -> list[Any]:
  """``out``, per-leaf tuples at ``treedef``'s leaves, as one tree per tuple
  position; the first (the directions) cast to ``updates``' dtypes."""
  parts = [treedef.unflatten(p) for p in zip(*treedef.flatten_up_to(out))]
  return [jax.tree.map(lambda n, u: n.astype(u.dtype), parts[0], updates),
          *parts[1:]]


def is_masked(x: Any) -> bool:
  return isinstance(x, optax.MaskedNode)

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
"""Dynamic bit-widths: each state leaf's format chosen as training goes.

An STQuant-style policy (Liu et al., 2026; only the paper's abstract and
figure captions are known, so every rule below is this library's reading,
documented in ``docs/bits.md``):

* **Statistics** (inside the compiled step, per parameter leaf ``l``, every
  ``sample_every`` steps): the gradient's magnitude ``n_l = RMS(g_l)`` and
  dispersion ``r_l = std(|g_l|) / mean(|g_l|)`` (the coefficient of
  variation of the magnitudes: 0.76 for a Gaussian, larger for heavy tails,
  scale-free and finite where ``std / |mean|`` is not), kept as running
  averages with bias correction; a sample counts at most ``OUTLIER`` times
  the average so far. Two sums per leaf; O(1) extra space per leaf.
* **Decisions** (every ``period`` steps, O(leaves)): the global references
  ``N`` and ``R`` are the size-weighted means of the leaves' averages; a
  leaf is *high* in a factor when its average exceeds ``threshold * tau(t) *
  reference``, ``tau(t) = 1 + anneal * min(1, t / anneal_steps)`` (the
  temporal annealing factor: late in training fewer leaves count as high).
  The two factors give the n-r quadrant (*redundant*, *structural*,
  *magnitude*, *critical*), which maps to a level of each field's candidate
  ladder (first and second moments may differ).
* **Hysteresis**: a dead band of ``margin`` around each threshold (a high
  leaf stays high down to ``(1 - margin)`` of it, a low one rises only
  above ``(1 + margin)``), and a new quadrant is committed only when it has
  been proposed at ``patience`` decisions in a row, and only at every
  ``patience``-th decision. Layouts change at most once per
  ``period * patience`` steps, which bounds the number of compiled steps.
* **Re-layout** (outside the compiled step, `relayout`): a leaf whose
  committed format differs from its stored one is decoded and re-encoded,
  so the bytes really change; the jitted step retraces once per new layout.

References:
  Liu et al, [STQuant: Spatio-Temporal Adaptive Framework for Optimizer
  Quantization in Large Multimodal Model
  Training](https://arxiv.org/abs/2604.06836), 2026
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
import dataclasses
import functools
import math
import warnings
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from optax_q._src.codec import codec as codec_lib
from optax_q._src.codec import formats as formats_lib
from optax_q._src.codec import qarray as qarray_lib
from optax_q._src.core import validation
from optax_q._src.state import sharding as sharding_lib
from optax_q._src.state import state_tree
from optax_q._src.state import transform

Format = formats_lib.Format
QArray = qarray_lib.QArray

ZONES = ('redundant', 'structural', 'magnitude', 'critical')
"""The names of the four zones of [`adaptive_bits`][optax_q.adaptive_bits],
indexed by zone code.

A leaf's zone is its quadrant in the magnitude-dispersion plane (the n-r
quadrants of STQuant's Fig. 3: magnitude ``n`` on the vertical axis,
dispersion ``r`` on the horizontal one), with code ``2 * high_magnitude +
high_dispersion``: ``'redundant'`` (0) is low in both factors,
``'structural'`` (1) high in dispersion only, ``'magnitude'`` (2) high in
magnitude only and ``'critical'`` (3) high in both. The ``zone`` field of
[`BitStatistics`][optax_q.BitStatistics] holds these codes (-1 before a
leaf's first commit), so ``ZONES[code]`` names a leaf's zone; the keys of
``adaptive_bits``'s ``zone_levels`` argument are these names.
"""
FACTORS = ('magnitude', 'dispersion')

# 3.25, 4.25 and 8.25 bits per element with float32 block scales; add
# 'bf16' for a 16-bit rung (or pass (format, 'block_pow2') pairs).
DEFAULT_CANDIDATES = {
    'mu': ('nf3', 'nf4', 'int8_dynamic'),
    'nu': ('int3_mulaw', 'ue4m0', 'int8_dynamic'),
}
# Which factor matters most to each field: the first moment's error is
# relative to its magnitude, the second moment's to the spread of v inside
# a block (what 4-bit grids lose: docs/lowbit.md).
DEFAULT_FACTORS = {'mu': 'magnitude', 'nu': 'dispersion'}
# A sample of a factor counts at most this many times the leaf's average.
OUTLIER = 10.0
# The path of the adapted fields below their AdaptiveBitsState (in
# bit_layout's names), and that path in layouts saved before the field
# ``inner`` was renamed ``inner_state``.
_SEGMENT = 'inner_state/inner_state/'
_LEGACY_SEGMENT = 'inner/inner_state/'


@functools.partial(jax.tree_util.register_dataclass, data_fields=[],
                   meta_fields=['fields', 'ladders', 'block_size', 'period',
                                'patience', 'names'])
@dataclasses.dataclass(frozen=True)
class BitPolicy:
  """The static part of an adaptive state: what each level means.

  Attributes:
    fields: The adapted state fields, e.g. ``('mu', 'nu')``.
    ladders: Per field, the candidates ``((Format, scale_mode), ...)`` from
      fewest to most bits.
    block_size: Elements per block scale.
    period: Steps between decisions.
    patience: Decisions between commits (and the consecutive proposals a
      commit needs).
    names: The parameter leaves' ``'a/b'`` paths, in the order of the
      statistics.
  """

  fields: tuple[str, ...]
  ladders: tuple[tuple[tuple[Format, str], ...], ...]
  block_size: int
  period: int
  patience: int
  names: tuple[str, ...]

  @property
  def commit_period(self) -> int:
    """Steps between two possible layout changes."""
    return self.period * self.patience

  def candidate(self, field: str, level: int) -> tuple[Format, str]:
    return self.ladders[self.fields.index(field)][level]


@functools.partial(
    jax.tree_util.register_dataclass,
    data_fields=['magnitude', 'dispersion', 'samples', 'zone', 'pending',
                 'streak', 'levels'], meta_fields=[])
@dataclasses.dataclass(frozen=True)
class BitStatistics:
  """Per-parameter-leaf statistics and decisions (telemetry, not moments).

  Attributes:
    magnitude: float32 ``[L]``, running average of ``RMS(g_l)``.
    dispersion: float32 ``[L]``, running average of ``std|g_l| / mean|g_l|``.
    samples: int32 ``[L]``, finite samples taken (for bias correction).
    zone: int32 ``[L]``, committed quadrant (``ZONES`` index; -1: none yet).
    pending: int32 ``[L]``, quadrant proposed at the last decision.
    streak: int32 ``[L]``, decisions in a row that proposed ``pending``.
    levels: int32 ``[F, L]``, committed ladder level per field.
  """

  is_telemetry = True  # Not optimizer moments: see ``telemetry``.

  magnitude: jax.Array
  dispersion: jax.Array
  samples: jax.Array
  zone: jax.Array
  pending: jax.Array
  streak: jax.Array
  levels: jax.Array


class AdaptiveBitsState(NamedTuple):
  """State of [`adaptive_bits`][optax_q.adaptive_bits].

  Attributes:
    count: Steps taken (int32).
    stats: The [`BitStatistics`][optax_q.BitStatistics] (replicated; a few
      scalars per parameter leaf).
    inner_state: The wrapped [`quantize_state`][optax_q.quantize_state]
      state, in the current formats (formerly ``inner``: ``state.inner``
      still reads it, with a ``DeprecationWarning``; see
      [`upgrade_checkpoint`][optax_q.upgrade_checkpoint] for checkpoints
      saved under that name).
    policy: The static [`BitPolicy`][optax_q.BitPolicy] (no buffers).
  """

  count: jax.Array  # shape=(), dtype=jnp.int32.
  stats: BitStatistics
  inner_state: transform.QuantizedState
  policy: BitPolicy

  @property
  def inner(self) -> transform.QuantizedState:
    """Deprecated name of ``inner_state``."""
    warnings.warn(
        'AdaptiveBitsState.inner is deprecated: the field is inner_state, as '
        'in every other wrapper state of optax_q.', DeprecationWarning,
        stacklevel=2)
    return self.inner_state


@dataclasses.dataclass(frozen=True)
class _Config:
  """Checked arguments of `adaptive_bits`."""

  ladders: dict[str, tuple[tuple[Format, str], ...]]
  table: dict[str, tuple[int, int, int, int]]  # field -> level per zone
  initial: dict[str, int]
  thresholds: tuple[float, float]
  period: int
  patience: int
  margin: float
  decay: float
  anneal: float
  anneal_steps: int
  sample_every: int
  min_size: int
  block_size: int


def _check_candidate(value: Any, name: str, nonnegative: bool
                     ) -> tuple[Format, str]:
  """``(Format, scale_mode)`` from a format or a ``(format, mode)`` pair."""
  mode = None
  if isinstance(value, tuple) and len(value) == 2 and isinstance(
      value[1], str):
    value, mode = value
  fmt = formats_lib.check_format(value, name)
  if fmt.is_identity:
    raise ValueError(
        f'{name}={fmt.name!r}: candidates are storage formats; float32 is '
        "what they save from (use 'bf16' as the 16-bit candidate).")
  if nonnegative:
    fmt = formats_lib.unsigned_variant(fmt)
  elif not fmt.signed:
    raise ValueError(
        f'{name}={fmt.name!r} is unsigned, but the field may be negative.')
  mode = (qarray_lib.default_scale_mode(fmt) if mode is None
          else validation.check_scale(mode, f'{name} scale mode'))
  qarray_lib.check_layout(fmt, mode, f'{name} scale mode')
  return fmt, mode


def _default_levels(size: int, primary: str) -> tuple[int, int, int, int]:
  """Levels per zone for a ladder of ``size`` and a field whose primary
  factor is ``primary``: redundant lowest, critical highest, high in the
  primary factor alone one below the top, in the other factor alone one
  above the bottom."""
  top = size - 1
  own = max(top - 1, min(1, top))
  other = 1 if size >= 3 else 0
  mag, disp = (own, other) if primary == 'magnitude' else (other, own)
  return (0, disp, mag, top)


def _check_adapted(field: Any, name: str, ladders) -> None:
  """Raises unless ``field`` has candidates."""
  if field not in ladders:
    raise ValueError(f'{name} names {field!r}, which has no candidates; '
                     f'fields: {sorted(ladders)}.')


def _config(  # pylint: disable=too-many-branches
    candidates, *, period, patience, margin, thresholds, decay, anneal,
    anneal_steps, initial, zone_levels, factors, sample_every, min_size,
    block_size, nonnegative) -> _Config:
  """Checks `adaptive_bits`' arguments, in the order of its signature."""
  # Ladders: {field: ((Format, scale_mode), ...)}, from fewest to most bits.
  if candidates is None:
    candidates = DEFAULT_CANDIDATES
  if not isinstance(candidates, Mapping) or not candidates:
    raise ValueError(
        'candidates must be a non-empty dict {field: (format, ...)} from '
        'fewest to most bits, e.g. {"mu": ("nf4", "int8_dynamic", "bf16")}, '
        f'got {validation.short(candidates)}.')
  validation.check_field_keys(candidates, 'candidates')
  ladders = {}
  for field, ladder in candidates.items():
    name = f'candidates[{field!r}]'
    if isinstance(ladder, (str, Format)) or not isinstance(
        ladder, Sequence) or not ladder:
      raise ValueError(
          f'{name} must be a non-empty sequence of formats (or (format, '
          f'scale_mode) pairs), got {validation.short(ladder)}.')
    checked = tuple(
        _check_candidate(c, f'{name}[{i}]', field in nonnegative)
        for i, c in enumerate(ladder))
    bits = [codec_lib.Codec(fmt, mode, block_size).stored_bits
            for fmt, mode in checked]
    if any(b > a for a, b in zip(bits[1:], bits[:-1])):
      raise ValueError(
          f'{name} must go from fewest to most stored bits, got '
          f'{[_layout_name(f, m) for f, m in checked]} '
          f'({[round(b, 3) for b in bits]} bits per element at block '
          f'{block_size}).')
    if len(set(checked)) != len(checked):
      raise ValueError(f'{name} lists a candidate twice: '
                       f'{[f.name for f, _ in checked]}.')
    ladders[field] = checked

  # The zone -> level table of each field: the defaults for its primary
  # factor, then the overrides of zone_levels.
  if factors is not None:
    if not isinstance(factors, Mapping):
      raise ValueError(
          "factors must be a dict {field: 'magnitude' | 'dispersion'} over "
          f'the fields with candidates {sorted(ladders)}, got '
          f'{validation.short(factors)}.')
    for field, factor in factors.items():
      _check_adapted(field, 'factors', ladders)
      validation.check_choice(factor, f'factors[{field!r}]', FACTORS)
  factors = {**DEFAULT_FACTORS, **(factors or {})}
  table = {f: _default_levels(len(l), factors.get(f, 'magnitude'))
           for f, l in ladders.items()}
  if zone_levels is not None:
    if not isinstance(zone_levels, Mapping):
      raise ValueError(
          'zone_levels must be a dict {zone: {field: level}} with zones in '
          f'{ZONES}, got {validation.short(zone_levels)}.')
    for zone, levels in zone_levels.items():
      validation.check_choice(zone, 'zone_levels key', ZONES)
      if not isinstance(levels, Mapping):
        raise ValueError(f'zone_levels[{zone!r}] must be a dict {{field: '
                         f'level}}, got {validation.short(levels)}.')
      for field, level in levels.items():
        _check_adapted(field, f'zone_levels[{zone!r}]', ladders)
        level = validation.check_int(
            level, f'zone_levels[{zone!r}][{field!r}]', low=0,
            high=len(ladders[field]) - 1)
        row = list(table[field])
        row[ZONES.index(zone)] = level
        table[field] = tuple(row)

  # The level of every leaf before its first commit: one below the top.
  start = {f: max(len(l) - 2, 0) for f, l in ladders.items()}
  if initial is not None:
    if isinstance(initial, Mapping):
      items = initial.items()
    else:
      items = [(f, initial) for f in ladders]
    for field, level in items:
      _check_adapted(field, 'initial', ladders)
      start[field] = validation.check_int(
          level, f'initial[{field!r}]', low=0, high=len(ladders[field]) - 1)

  # Thresholds: (magnitude, dispersion), or a dict by factor (default 1).
  if isinstance(thresholds, Mapping):
    unknown = set(thresholds) - set(FACTORS)
    if unknown:
      raise ValueError(f'thresholds keys must be in {FACTORS}, got '
                       f'{sorted(unknown)}.')
    thresholds = tuple(thresholds.get(f, 1.0) for f in FACTORS)
  elif not isinstance(thresholds, Sequence) or len(thresholds) != 2:
    raise ValueError(
        'thresholds must be (magnitude, dispersion), two positive numbers '
        'relative to the global references, or a dict by factor; got '
        f'{validation.short(thresholds)}.')
  thresholds = tuple(validation.check_number(
      t, f'thresholds[{i}]', low=0.0, high=1e6, closed='(]', concrete=True)
                     for i, t in enumerate(thresholds))

  period = validation.check_int(period, 'period', low=1,
                                high=validation.MAX_PERIOD)
  patience = validation.check_int(patience, 'patience', low=1, high=1000)
  try:
    margin = validation.check_number(margin, 'margin', low=0.0, high=1.0,
                                     concrete=True)
  except ValueError as e:
    raise ValueError(f'{e} A dead band of 1 or more never lets a leaf that '
                     'is high in a factor come down: the decisions could '
                     'not settle.') from None
  return _Config(
      ladders=ladders, table=table, initial=start, thresholds=thresholds,
      period=period, patience=patience, margin=margin,
      decay=validation.check_number(decay, 'decay', low=0.0, high=1.0,
                                    concrete=True),
      anneal=validation.check_number(anneal, 'anneal', low=0.0, high=1e6,
                                     closed='[]', concrete=True),
      anneal_steps=validation.check_int(anneal_steps, 'anneal_steps', low=1,
                                        high=validation.MAX_PERIOD),
      sample_every=validation.check_int(sample_every, 'sample_every', low=1,
                                        high=validation.MAX_PERIOD),
      min_size=min_size, block_size=block_size)


def _param_names(tree: Any) -> tuple[list[str], list[Any]]:
  """``('a/b' path, leaf)`` of every leaf of a parameter-shaped tree."""
  flat = jax.tree_util.tree_flatten_with_path(tree, is_leaf=state_tree.is_box)[0]
  names, leaves = [], []
  for path, leaf in flat:
    if state_tree.is_box(leaf):
      leaf = jax.tree.leaves(leaf)[0]
    names.append(state_tree.path_str(path))
    leaves.append(leaf)
  return names, leaves


def _eligible(cfg: _Config, leaves: list[Any]) -> np.ndarray:
  """Static mask of the leaves whose state may be quantized."""
  return np.array([
      state_tree.is_float_array(x) and math.prod(x.shape) >= max(
          cfg.min_size, 1) for x in leaves], bool)


def _moments(g: jax.Array) -> tuple[jax.Array, jax.Array]:
  """``(RMS(g), std|g| / mean|g|)`` of one gradient leaf, in float32."""
  g = jnp.asarray(g, jnp.float32)
  size = max(g.size, 1)
  # Scaled by the largest magnitude first: no overflow in the squares of a
  # leaf of huge values, no underflow in those of tiny ones.
  peak = jnp.max(jnp.abs(g)) if g.size else jnp.float32(0)
  safe = jnp.where((peak > 0) & jnp.isfinite(peak), peak, 1.0)
  u = g / safe
  mean_sq = jnp.sum(u * u) / size
  mean_abs = jnp.sum(jnp.abs(u)) / size
  rms = jnp.sqrt(mean_sq) * safe
  ratio = mean_sq / jnp.maximum(mean_abs * mean_abs, jnp.finfo(jnp.float32).tiny)
  cv = jnp.where(mean_abs > 0, jnp.sqrt(jnp.maximum(ratio - 1.0, 0.0)), 0.0)
  return rms, cv


def _average(cfg: _Config, ema: jax.Array, samples: jax.Array) -> jax.Array:
  """The bias-corrected running average (0 before the first sample)."""
  correction = 1 - jnp.float32(cfg.decay) ** samples.astype(jnp.float32)
  return jnp.where(samples > 0, ema / jnp.where(samples > 0, correction, 1.0),
                   0.0)


def annealing(cfg: _Config, count: jax.Array) -> jax.Array:
  """``tau(t) = 1 + anneal * min(1, t / anneal_steps)``."""
  t = jnp.minimum(count.astype(jnp.float32) / cfg.anneal_steps, 1.0)
  return 1.0 + jnp.float32(cfg.anneal) * t


def _high(value, reference, threshold, was_high, margin):
  """High in one factor, with the dead band around the threshold."""
  t = threshold * reference
  up = value > t * (1 + margin)
  stay = value > t * (1 - margin)
  return jnp.where(was_high, stay, up)


def _decide(cfg: _Config, fields: tuple[str, ...], eligible: np.ndarray,
            sizes: np.ndarray, stats: BitStatistics, count: jax.Array
            ) -> BitStatistics:
  """One decision: propose quadrants; commit the settled ones."""
  seen = jnp.asarray(eligible) & (stats.samples > 0)
  n = jnp.where(seen, _average(cfg, stats.magnitude, stats.samples), 0.0)
  r = jnp.where(seen, _average(cfg, stats.dispersion, stats.samples), 0.0)
  w = jnp.where(seen, jnp.asarray(sizes, jnp.float32), 0.0)
  total = jnp.maximum(jnp.sum(w), 1.0)
  tau = annealing(cfg, count)
  ref_n = jnp.sum(w * n) / total * tau
  ref_r = jnp.sum(w * r) / total * tau
  zone = stats.zone
  known = zone >= 0
  margin = jnp.where(known, jnp.float32(cfg.margin), 0.0)
  hi_n = _high(n, ref_n, cfg.thresholds[0], known & (zone >= 2), margin)
  hi_r = _high(r, ref_r, cfg.thresholds[1], known & (zone % 2 == 1), margin)
  proposal = 2 * hi_n.astype(jnp.int32) + hi_r.astype(jnp.int32)
  streak = jnp.where(proposal == stats.pending, stats.streak + 1, 1)
  decision = count // cfg.period
  commit = (decision % cfg.patience == 0) & seen & (streak >= cfg.patience)
  zone = jnp.where(commit, proposal, zone)
  table = jnp.asarray(np.array([cfg.table[f] for f in fields],
                               np.int32).reshape(len(fields), len(ZONES)))
  levels = jnp.where(zone[None, :] >= 0, table[:, jnp.maximum(zone, 0)],
                     stats.levels)
  return dataclasses.replace(stats, zone=zone, pending=proposal,
                             streak=streak, levels=levels)


def adaptive_bits(
    inner: optax.GradientTransformation,
    candidates: Mapping[str, Sequence[Any]] | None = None,
    *,
    period: int = 100,
    patience: int = 2,
    margin: float = 0.1,
    thresholds: Sequence[float] | Mapping[str, float] = (1.0, 1.0),
    decay: float = 0.9,
    anneal: float = 1.0,
    anneal_steps: int = 10_000,
    initial: int | Mapping[str, int] | None = None,
    zone_levels: Mapping[str, Mapping[str, int]] | None = None,
    factors: Mapping[str, str] | None = None,
    sample_every: int = 1,
    rounding: str | Mapping[str, str] = 'stochastic',
    seed: int | None = None,
    min_size: int | None = None,
    block_size: int | None = None,
    track_stalls: bool = True,
    elementwise: bool = False,
    tile_size: int | None = transform.DEFAULT_TILE_SIZE,
    nonnegative_fields: Sequence[str] = transform.NONNEGATIVE_FIELDS,
    kernel: str = 'auto',
) -> optax.GradientTransformationExtraArgs:
  r"""Keeps ``inner``'s state in formats chosen per leaf as training goes.

  The state is that of [`quantize_state`][optax_q.quantize_state] with every
  leaf of an adapted field (``mu``, ``nu``, ...) in one of that field's
  ``candidates``, plus per-parameter gradient statistics. Every ``period`` steps
  the step itself decides, from the statistics, which candidate each leaf should
  use (see the module docstring and ``docs/bits.md``);
  [`relayout`][optax_q.relayout], called between steps, re-encodes the leaves
  whose decision changed. The decisions are computed from global reductions
  inside the compiled step, so every device and every process of a sharded run
  reaches the same ones.

  Every ``sample_every`` steps, each parameter leaf `l` (of `|l|` elements)
  takes a sample of its gradient's magnitude and dispersion,

  ```tex
  n_l = \sqrt{\tfrac{1}{|l|} \textstyle\sum_i g_{l,i}^2}, \qquad
  r_l = \frac{\operatorname{std}(|g_l|)}{\operatorname{mean}(|g_l|)},
  ```

  into running averages with decay `d` (``decay``), bias-corrected by the
  number `s_l` of finite samples taken (a non-finite sample is skipped, and
  once `s_l > 0` a sample counts at most ``OUTLIER`` (10) times the average
  so far); the references `N`, `R` are the averages' size-weighted means over
  the sampled leaves:

  ```tex
  m_l \leftarrow d\, m_l + (1 - d) \min(n_l,\, 10\, \bar n_l), \qquad
  \bar n_l = \frac{m_l}{1 - d^{s_l}}, \qquad
  N = \frac{\sum_l |l|\, \bar n_l}{\sum_l |l|}
  ```

  (`\bar r_l` and `R` likewise). Every ``period`` steps each leaf is
  proposed the zone `z_l = 2 h^n_l + h^r_l` (an index of ``ZONES``), with

  ```tex
  h^n_l = \big[\bar n_l > (1 \pm \mu)\, \theta_n\, \tau(t)\, N\big], \quad
  h^r_l = \big[\bar r_l > (1 \pm \mu)\, \theta_r\, \tau(t)\, R\big], \quad
  \tau(t) = 1 + a \min(1, t / T_a),
  ```

  for ``thresholds`` `(\theta_n, \theta_r)`, ``anneal`` `a` and
  ``anneal_steps`` `T_a`; the dead band `\mu` (``margin``) is subtracted
  where the leaf's committed zone is high in that factor, added where it is
  low, and 0 before its first commit. A proposal is committed once it has
  been made at ``patience`` decisions in a row, at every ``patience``-th
  decision; field `f` of the leaf then takes level `k = T_f[z_l]` of its
  ladder (the table of ``zone_levels``), and after
  [`relayout`][optax_q.relayout] its stored state `x` is `Q_k(x)` as in
  [`quantize_state`][optax_q.quantize_state].

  Args:
    inner: Any Optax transformation (``optax.scale_by_adam()``, ...).
    candidates: ``{field: (format, ...)}`` from fewest to most bits; an
      entry may be a ``(format, scale_mode)`` pair such as ``('nf4',
      'block_pow2')``. Non-negative fields take unsigned variants as in
      [`quantize_state`][optax_q.quantize_state]. Default: ``mu`` in ``('nf3',
      'nf4', 'int8_dynamic')``, ``nu`` in ``('int3_mulaw', 'ue4m0',
      'int8_dynamic')`` (3.25, 4.25 and 8.25 bits per element); add
      ``'bf16'`` at the end of a ladder for a 16-bit rung.
    period: Steps between decisions (K), a positive int.
    patience: Decisions between commits, and the consecutive identical
      proposals a commit needs; a positive int. The layout changes at most
      once every ``period * patience`` steps.
    margin: Dead band around each threshold, in ``[0, 1)``: a leaf that is
      high in a factor stays high until it falls below ``(1 - margin)`` of
      the threshold; a low one becomes high above ``(1 + margin)``.
    thresholds: ``(magnitude, dispersion)`` thresholds, positive, relative
      to the global references (size-weighted means over leaves).
    decay: Decay of the running averages, in ``[0, 1)``.
    anneal: Temporal annealing: thresholds grow by ``1 + anneal * min(1,
      t / anneal_steps)``, ``>= 0`` (0: off).
    anneal_steps: Steps over which the annealing factor grows.
    initial: The ladder level of every leaf until its first commit (an int
      or ``{field: int}``); default one below the top (4-bit with the
      default ladders).
    zone_levels: ``{zone: {field: level}}`` overrides of the quadrant-to-
      level table, zones in ``ZONES``. By default ``redundant`` maps to the
      lowest level and ``critical`` to the highest; a field's primary factor
      alone (see ``factors``) one below the top, the other factor alone one
      above the bottom.
    factors: ``{field: 'magnitude' | 'dispersion'}``, each field's primary
      factor; default ``mu``: magnitude, ``nu``: dispersion.
    sample_every: Take the statistics every this many steps (1: every
      step); other steps skip the two reductions per leaf.
    rounding: As [`quantize_state`][optax_q.quantize_state].
    seed: As [`quantize_state`][optax_q.quantize_state].
    min_size: As [`quantize_state`][optax_q.quantize_state].
    block_size: As [`quantize_state`][optax_q.quantize_state].
    track_stalls: As [`quantize_state`][optax_q.quantize_state].
    elementwise: As [`quantize_state`][optax_q.quantize_state].
    tile_size: As [`quantize_state`][optax_q.quantize_state].
    nonnegative_fields: As [`quantize_state`][optax_q.quantize_state].
    kernel: As [`quantize_state`][optax_q.quantize_state].

  Returns:
    A gradient transformation whose state is an
      [`AdaptiveBitsState`][optax_q.AdaptiveBitsState].

  Raises:
    ValueError: at construction, naming the bad argument and the allowed
      values: an unknown or float32 candidate, an empty ladder or one not
      ordered by bits, a non-positive period or patience, thresholds not
      positive, a margin outside ``[0, 1)`` (a dead band that never
      settles), levels out of a ladder's range.

  Examples:
    >>> import jax, jax.numpy as jnp, optax, optax_q
    >>> tx = optax_q.adaptive_bits(optax.scale_by_adam(), period=10,
    ...                            min_size=0)
    >>> state = tx.init({'w': jnp.zeros((8, 256))})
    >>> optax_q.bit_layout(state)
    {'inner_state/inner_state/mu/w': 'nf4/block',
     'inner_state/inner_state/nu/w': 'ue4m0/block'}

  References:
    Liu et al, [STQuant: Spatio-Temporal Adaptive Framework for Optimizer
    Quantization in Large Multimodal Model
    Training](https://arxiv.org/abs/2604.06836), 2026
  """
  validation.check_transform(inner)
  nonnegative = frozenset(validation.check_names(nonnegative_fields,
                                                 'nonnegative_fields'))
  _, block, _, min_elems = transform.check_storage_args(
      rounding=rounding, block_size=block_size, seed=seed, min_size=min_size)
  cfg = _config(
      candidates, period=period, patience=patience, margin=margin,
      thresholds=thresholds, decay=decay, anneal=anneal,
      anneal_steps=anneal_steps, initial=initial, zone_levels=zone_levels,
      factors=factors, sample_every=sample_every, min_size=min_elems,
      block_size=block, nonnegative=nonnegative)
  probed = state_tree.probe_field_names(inner)
  if probed is not None and set(cfg.ladders) - probed[0]:
    raise ValueError(
        f'candidates names state field(s) '
        f'{sorted(set(cfg.ladders) - probed[0])} that this inner '
        f"transform's state lacks; its float fields are {sorted(probed[0])}: "
        "pass candidates={field: (format, ...)} for those (e.g. "
        "{'trace': ('nf4', 'int8_dynamic')} for optax.trace).")
  start = {f: cfg.ladders[f][cfg.initial[f]] for f in cfg.ladders}
  quantized = transform.quantize_state(
      inner, formats={f: fmt for f, (fmt, _) in start.items()},
      scale_mode={f: mode for f, (_, mode) in start.items()},
      rounding=rounding, seed=seed, min_size=min_size, block_size=block_size,
      track_stalls=track_stalls, elementwise=elementwise,
      tile_size=tile_size, nonnegative_fields=nonnegative, kernel=kernel)

  def init_fn(params):
    names, leaves = _param_names(params)
    fields = tuple(cfg.ladders)
    num = len(leaves)
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
      raise ValueError(
          f'adaptive_bits: parameter paths {twice} name more than one leaf '
          "(a key with '/' next to a nested one?); rename them so that each "
          'leaf has its own a/b/c path.')
    policy = BitPolicy(
        fields=fields, ladders=tuple(cfg.ladders[f] for f in fields),
        block_size=cfg.block_size, period=cfg.period, patience=cfg.patience,
        names=tuple(names))
    # One array per leaf: a state whose leaves share a buffer can't be
    # donated (jax.jit(..., donate_argnums=...) would free it twice).
    stats = BitStatistics(
        magnitude=jnp.zeros([num], jnp.float32),
        dispersion=jnp.zeros([num], jnp.float32),
        samples=jnp.zeros([num], jnp.int32),
        zone=jnp.full([num], -1, jnp.int32),
        pending=jnp.full([num], -1, jnp.int32),
        streak=jnp.zeros([num], jnp.int32),
        levels=jnp.asarray(
            np.array([[cfg.initial[f]] * num for f in fields],
                     np.int32).reshape(len(fields), num)))
    state = AdaptiveBitsState(
        count=jnp.zeros([], jnp.int32), stats=stats,
        inner_state=quantized.init(params), policy=policy)
    if not _leaf_slots(state) and _eligible(cfg, leaves).any():
      raise ValueError(
          f'adaptive_bits: no leaf of the fields {list(fields)} in the inner '
          'state is laid out per parameter (field/<parameter path>), so no '
          'format could ever change. Parameters keyed by attribute (a '
          'NamedTuple or dataclass of arrays) are not supported: pass them '
          'as a dict.')
    return state

  def update_fn(updates, state, params=None, **extra_args):
    names, grads = _param_names(updates)
    if len(names) != len(state.policy.names):
      raise ValueError(
          f'adaptive_bits: the updates have {len(names)} leaves, the state '
          f'was initialised for {len(state.policy.names)}.')
    eligible = _eligible(cfg, grads)
    sizes = np.array([math.prod(getattr(g, 'shape', ())) for g in grads],
                     np.float64)
    count = optax.safe_increment(state.count)

    def sample(stats):
      # One sample of every eligible leaf's factors into its averages.
      n, r = [], []
      for g, ok in zip(grads, eligible):
        a, b = _moments(g) if ok else (jnp.float32(0), jnp.float32(0))
        n.append(a)
        r.append(b)
      n, r = jnp.stack(n), jnp.stack(r)
      take = jnp.asarray(eligible) & jnp.isfinite(n) & jnp.isfinite(r)
      # A sample counts at most OUTLIER times the leaf's average so far: one
      # spike (a finite gradient 1e15 times the usual) moves the average by
      # a bounded step instead of holding the leaf's zone for hundreds of
      # steps.
      seen = stats.samples > 0
      n = jnp.where(seen, jnp.minimum(n, OUTLIER * _average(
          cfg, stats.magnitude, stats.samples)), n)
      r = jnp.where(seen, jnp.minimum(r, OUTLIER * _average(
          cfg, stats.dispersion, stats.samples)), r)
      d = jnp.float32(cfg.decay)
      return dataclasses.replace(
          stats,
          magnitude=jnp.where(take, d * stats.magnitude + (1 - d) * n,
                              stats.magnitude),
          dispersion=jnp.where(take, d * stats.dispersion + (1 - d) * r,
                               stats.dispersion),
          samples=stats.samples + take.astype(jnp.int32))

    stats = state.stats
    if eligible.any():
      stats = (sample(stats) if cfg.sample_every == 1 else jax.lax.cond(
          state.count % cfg.sample_every == 0, sample, lambda s: s, stats))
      stats = jax.lax.cond(
          count % cfg.period == 0,
          lambda s: _decide(cfg, state.policy.fields, eligible, sizes, s,
                            count),
          lambda s: s, stats)
    new_updates, inner_state = quantized.update(
        updates, state.inner_state, params, **extra_args)
    return new_updates, AdaptiveBitsState(
        count=count, stats=stats, inner_state=inner_state, policy=state.policy)

  return optax.GradientTransformationExtraArgs(init_fn, update_fn)


# ----------------------------------------------------------------------------
# Between steps: reading decisions, re-encoding, layouts for checkpoints.
# ----------------------------------------------------------------------------


def _is_adaptive(x: Any) -> bool:
  return isinstance(x, AdaptiveBitsState)


def _layout_name(fmt: Format, mode: str) -> str:
  return f'{fmt.name}/{mode}'


def _leaf_slots(node: AdaptiveBitsState):
  """``(path, field, param index, QArray)`` of the adapted leaves."""
  policy = node.policy
  root = node.inner_state.inner_state
  index = {n: i for i, n in enumerate(policy.names)}
  flat = jax.tree_util.tree_flatten_with_path(
      root, is_leaf=qarray_lib.is_qarray)[0]
  out = []
  for path, leaf in flat:
    if not qarray_lib.is_qarray(leaf):
      continue
    field = state_tree.field_name(path, root)
    if field not in policy.fields:
      continue
    cut = max(i for i, k in enumerate(path)
              if isinstance(k, jax.tree_util.GetAttrKey) and k.name == field)
    name = state_tree.path_str(path[cut + 1:])
    if name in index:
      out.append((path, field, index[name], leaf))
  return out


@functools.partial(jax.jit, static_argnums=1)
def _reencode(q: QArray, codec: codec_lib.Codec) -> QArray:
  return codec.encode(qarray_lib.decode(q), key=None, dtype=q.dtype)


def _box_of(x: Any) -> Any:
  """The box (an ``nnx.Variable``) around codes or scales, or None."""
  if x is None or isinstance(x, (jax.Array, jax.ShapeDtypeStruct)):
    return None
  children = jax.tree_util.tree_flatten_with_path(
      x, is_leaf=lambda y: y is not x)[0]
  return x if len(children) == 1 and children[0][0] == (
      jax.tree_util.GetAttrKey('value'),) else None


def _in_device_memory(x: Any) -> Any:
  """``x`` in its devices' default memory: a buffer offloaded to another
  (``'pinned_host'``) can't be decoded where it is."""
  sharding = getattr(x, 'sharding', None)
  if getattr(sharding, 'memory_kind', None) is None:
    return x
  default = next(iter(sharding.addressable_devices)).default_memory().kind
  if sharding.memory_kind == default:
    return x
  return jax.device_put(x, sharding.with_memory_kind(default))


def _convert(q: QArray, codec: codec_lib.Codec) -> QArray:
  """``q`` re-encoded (nearest) with ``codec``; abstract in, abstract out.

  Boxes around the codes and scales (``nnx.Optimizer`` wraps every state
  array in one) go around the new codes and scales, so that the result can
  be assigned back to the optimizer as it is."""
  boxes = (_box_of(q.codes), _box_of(q.scale))
  plain = dataclasses.replace(q, **{
      f: jax.tree.leaves(b)[0] for f, b in zip(('codes', 'scale'), boxes)
      if b is not None})
  if isinstance(plain.codes, jax.ShapeDtypeStruct):
    new = jax.eval_shape(lambda x: _reencode(x, codec), plain)
  else:
    new = _reencode(jax.tree.map(_in_device_memory, plain), codec)
  return dataclasses.replace(new, **{
      f: state_tree.rebox(b, getattr(new, f))
      for f, b in zip(('codes', 'scale'), boxes)
      if b is not None and getattr(new, f) is not None})


def _upgrade_layout(state: Any, layout: Mapping[str, str]
                    ) -> Mapping[str, str]:
  """``layout`` with the paths of earlier versions (``.../inner/...``)
  renamed as ``bit_layout(state)`` names them, with a warning."""
  legacy = {}

  def visit(node, prefix):
    for path, _, _, _ in _leaf_slots(node):
      name = state_tree.path_str(path)
      legacy[prefix + _LEGACY_SEGMENT + name] = (
          prefix + _SEGMENT + name)
    return node

  _map_adaptive(visit, state)
  old = [k for k in layout if k in legacy and legacy[k] not in layout]
  if not old:
    return layout
  warnings.warn(
      f'layout names {len(old)} path(s) as bit_layout did before '
      f"AdaptiveBitsState.inner was renamed inner_state (e.g. {old[0]!r}); "
      'they are read as the new paths, but this is deprecated: save the '
      'layout again with bit_layout.', DeprecationWarning, stacklevel=3)
  return {legacy.get(k, k): v for k, v in layout.items()}


def upgrade_checkpoint(tree: Any) -> Any:
  """A state restored without a target, in the current field names.

  Orbax saves a ``NamedTuple`` under its field names, so a checkpoint of an
  [`AdaptiveBitsState`][optax_q.AdaptiveBitsState] written before its field
  ``inner`` was renamed ``inner_state`` does not restore into today's
  abstract state. Restore it without a target (nested dicts of arrays),
  rename it here, and fit it to the target with Orbax:

  ```python
  with ocp.StandardCheckpointer() as ckptr:
    raw = ckptr.restore(path)  # No target: nested dicts.
  state = ocp.tree.deserialize_tree(optax_q.upgrade_checkpoint(raw), target)
  ```

  ``target`` is the abstract state (``jax.eval_shape`` of ``tx.init``,
  re-laid out with [`relayout`][optax_q.relayout] to the saved
  [`bit_layout`][optax_q.bit_layout]), or a whole train state holding it,
  such as ``nnx.state((model, optimizer))``. ``relayout`` reads a layout
  saved by the earlier versions as it is (with a ``DeprecationWarning``).

  Args:
    tree: A tree of dicts, lists and arrays as Orbax restores it without a
      target; trees in today's names pass through unchanged.

  Returns:
    ``tree`` with the key ``inner`` of every adaptive-bits node (a dict
    holding ``count``, ``stats`` with ``levels``, and ``inner``) renamed
    ``inner_state``; other nodes and all leaves as they are.

  Examples:
    >>> import optax_q
    >>> raw = [{'count': 3, 'inner': {'mu': {}}, 'stats': {'levels': 0}}]
    >>> optax_q.upgrade_checkpoint(raw)
    [{'count': 3, 'inner_state': {'mu': {}}, 'stats': {'levels': 0}}]
  """

  def is_legacy(x):
    return (isinstance(x, Mapping) and 'inner' in x and 'count' in x
            and 'inner_state' not in x and isinstance(x.get('stats'), Mapping)
            and 'levels' in x['stats'])

  def visit(x):
    if isinstance(x, Mapping):
      items = {('inner_state' if k == 'inner' and is_legacy(x) else k):
               visit(v) for k, v in x.items()}
      return items if isinstance(x, dict) else type(x)(items)
    if isinstance(x, tuple) and hasattr(x, '_fields'):
      return type(x)(*(visit(v) for v in x))
    if isinstance(x, (list, tuple)):
      return type(x)(visit(v) for v in x)
    return x

  return visit(tree)


def _check_adaptive_state(state: Any, func: str) -> None:
  """``state`` holds at least one `AdaptiveBitsState`."""
  if not any(_is_adaptive(x) for x in jax.tree.leaves(
      state, is_leaf=lambda x: _is_adaptive(x) or qarray_lib.is_qarray(x))):
    raise ValueError(
        f'{func} needs a state with adaptive bits (an optimizer state holding '
        'AdaptiveBitsState nodes, from optax_q.adaptive_bits), but state='
        f'{validation.short(state)} of type {type(state).__name__} holds '
        'none.')


def _map_adaptive(fn: Callable[[AdaptiveBitsState, str], Any], state: Any):
  """``fn(node, 'a/b/')`` on every `AdaptiveBitsState` of ``state``."""
  return jax.tree_util.tree_map_with_path(
      lambda p, x: fn(x, state_tree.path_str(p) + '/' if p else '')
      if _is_adaptive(x) else x,
      state, is_leaf=lambda x: _is_adaptive(x) or qarray_lib.is_qarray(x))


def relayout(state: Any, layout: Mapping[str, str] | None = None, *,
             step: int | None = None, param_shardings: Any = None,
             shard_over: Any = None, memory_kind: str | None = None) -> Any:
  """Re-encodes the adapted leaves whose committed format changed.

  Call it between steps, outside ``jax.jit`` (the new state has a new
  structure: the next call of a jitted step compiles once for it). Leaves
  are decoded and re-encoded with round-to-nearest; the others are
  returned as they are (same buffers).

  With a Flax NNX optimizer, pass its state and assign the result back:
  ``opt.opt_state = optax_q.relayout(opt.opt_state, step=step)``. The
  boxes ``nnx.Optimizer`` puts around the state's arrays are kept around
  the new codes and scales. A state of plain arrays (one restored from a
  checkpoint without them, say) assigned there fails at the next
  ``opt.update`` with "Cannot set key ... on immutable node of type
  QArray" (or of another state node): wrap it first,
  ``opt.opt_state = nnx.data(flax.nnx.training.optimizer.to_opt_state(new))``.

  Args:
    state: Any optimizer state holding
      [`AdaptiveBitsState`][optax_q.AdaptiveBitsState] nodes (inside
      ``optax.chain`` and the like); concrete or abstract (from
      ``jax.eval_shape``: the result is abstract too).
    layout: ``{path: 'format/scale_mode'}`` as
      [`bit_layout`][optax_q.bit_layout] returns it, to apply instead of the
      state's committed levels: the way to rebuild a saved layout on an abstract
      state before a checkpoint restore. A layout saved before
      ``AdaptiveBitsState.inner`` was renamed ``inner_state`` (paths
      ``.../inner/inner_state/...``) is read as today's paths, with a
      ``DeprecationWarning``.
    step: The number of updates applied so far, if known. Layouts can only
      change every ``period * patience`` steps, so other steps return
      ``state`` at once without reading anything from the devices.
    param_shardings: The parameters' ``NamedSharding`` tree: the new
      buffers are then placed as [`state_shardings`][optax_q.state_shardings]
      lays them out (without it they keep the placement XLA gives the
      re-encoding).
    shard_over: With ``param_shardings``: the mesh axis (or axes) the state
      is also split over, as ``state_shardings(..., shard_over=...)``
      places it (ZeRO-1); without it, a state split over a data axis would
      be placed like its parameters again.
    memory_kind: With ``param_shardings``: the memory the new buffers are
      placed in, as ``state_shardings(..., memory_kind=...)`` (a state
      offloaded to ``'pinned_host'`` stays there).

  Returns:
    The state with every adapted leaf in its committed (or given) format;
    ``state`` itself (the same object) when no leaf changes.

  Raises:
    ValueError: if ``state`` holds no
      [`AdaptiveBitsState`][optax_q.AdaptiveBitsState] (None, a plain
      optimizer's state), ``layout`` is not a dict of candidates of this
      state, ``step`` is not an int >= 0, or ``param_shardings``,
      ``shard_over`` or ``memory_kind`` is one that ``state_shardings``
      rejects (checked on every call, whether or not a leaf changes).

  Examples:
    >>> import jax.numpy as jnp, optax, optax_q
    >>> tx = optax_q.adaptive_bits(optax.scale_by_adam(), min_size=0)
    >>> state = tx.init({'w': jnp.zeros((8, 256))})
    >>> state = optax_q.relayout(
    ...     state, {'inner_state/inner_state/mu/w': 'nf3/block'})
    >>> optax_q.bit_layout(state)['inner_state/inner_state/mu/w']
    'nf3/block'
  """
  _check_adaptive_state(state, 'relayout')
  if param_shardings is not None:
    # Checks the placement now, not at the first step that changes a leaf.
    sharding_lib.state_shardings(None, param_shardings,
                                 shard_over=shard_over,
                                 memory_kind=memory_kind)
  if step is not None:
    step = validation.check_int(step, 'step')
    periods = {x.policy.commit_period for x in jax.tree.leaves(
        state, is_leaf=_is_adaptive) if _is_adaptive(x)}
    if not any(step % p == 0 for p in periods):
      return state
  if layout is not None and not isinstance(layout, Mapping):
    raise ValueError('layout must be a dict {path: "format/scale_mode"} as '
                     f'bit_layout returns, got {validation.short(layout)}.')
  if param_shardings is None and (shard_over is not None
                                  or memory_kind is not None):
    raise ValueError(
        'shard_over and memory_kind place the new buffers as '
        'state_shardings does, from the parameters\' shardings: pass '
        'param_shardings too.')
  if layout is not None:
    layout = _upgrade_layout(state, layout)
    unknown = sorted(set(layout) - set(bit_layout(state)))
    if unknown:
      raise ValueError(
          f'layout names {len(unknown)} path(s) that are not adapted leaves '
          f'of this state, e.g. {unknown[:3]}; its paths are '
          f'{sorted(bit_layout(state))[:3]}... (a layout saved from another '
          'tree, such as a whole train state instead of its optimizer '
          'state?)')
  changed = []

  def visit(node, prefix):
    # Each adapted leaf's target (format, scale mode): its committed level
    # (read on this host: the levels are replicated), or its entry of
    # ``layout``. The leaves not already in it are re-encoded.
    policy = node.policy
    if layout is None:
      levels = node.stats.levels
      if isinstance(levels, jax.core.Tracer):
        raise ValueError(
            'relayout reads the committed formats from the state and '
            "changes the state's structure: call it between steps, outside "
            'jax.jit (or pass layout=, which needs no values).')
      if isinstance(levels, jax.ShapeDtypeStruct):
        raise ValueError(
            'relayout of an abstract state (jax.eval_shape) has no decisions '
            'to read: pass the layout to apply, layout=bit_layout(state) of '
            'the state that was saved.')
      if isinstance(levels, jax.Array) and not levels.is_fully_addressable:
        levels = levels.addressable_data(0)
      levels = np.asarray(levels)
    changes = {}
    for path, field, index, leaf in _leaf_slots(node):
      name = prefix + _SEGMENT + state_tree.path_str(path)
      ladder = policy.ladders[policy.fields.index(field)]
      if layout is None:
        fmt, mode = ladder[int(levels[policy.fields.index(field), index])]
      elif name not in layout:
        continue
      else:
        fmt, mode = next(
            ((f, m) for f, m in ladder if layout[name] in (
                _layout_name(f, m), _layout_name(f, 'block'))),
            (None, None))
        if fmt is None:
          raise ValueError(
              f'layout[{name!r}]={validation.short(layout[name])} is not a '
              f'candidate of {field!r}: '
              f'{[_layout_name(f, m) for f, m in ladder]}.')
      codec = codec_lib.Codec.for_leaf(fmt, mode, policy.block_size,
                                       leaf.shape)
      if (codec.fmt, codec.scale_mode) == (leaf.fmt, leaf.scale_mode):
        continue
      changes[tuple(path)] = _convert(leaf, codec)
    changed.append(bool(changes))
    if not changes:
      return node
    flat, treedef = jax.tree_util.tree_flatten_with_path(
        node.inner_state.inner_state, is_leaf=qarray_lib.is_qarray)
    inner_state = node.inner_state._replace(inner_state=treedef.unflatten(
        [changes.get(tuple(p), x) for p, x in flat]))
    return node._replace(inner_state=inner_state)

  new = _map_adaptive(visit, state)
  if not any(changed):
    return state  # Nothing to re-encode: the same state, not a copy.
  if param_shardings is not None:
    shardings = sharding_lib.state_shardings(
        new, param_shardings, shard_over=shard_over, memory_kind=memory_kind)
    new = jax.tree.map(
        lambda x, s: x if isinstance(x, jax.ShapeDtypeStruct) or (
            getattr(x, 'sharding', None) == s) else jax.device_put(x, s),
        new, shardings)
  return new


def bit_layout(state: Any) -> dict[str, str]:
  """The format of every adapted leaf: ``{path: 'format/scale_mode'}``.

  A small JSON-able dict: save it with a checkpoint (e.g. Orbax's
  ``JsonSave`` next to the state) and pass it to [`relayout`][optax_q.relayout]
  on the abstract state before restoring, so the target has the saved formats.

  Args:
    state: Any optimizer state (concrete or abstract) holding
      [`AdaptiveBitsState`][optax_q.AdaptiveBitsState] nodes.

  Returns:
    ``{'a/b/c' path: 'format/scale_mode'}``, in the state's flattening
    order; empty where the state has no adapted leaf.

  Examples:
    >>> import jax.numpy as jnp, optax, optax_q
    >>> tx = optax.chain(
    ...     optax_q.adaptive_bits(optax.scale_by_adam(), min_size=0),
    ...     optax.scale_by_learning_rate(1e-3))
    >>> optax_q.bit_layout(tx.init({'w': jnp.zeros((8, 256))}))
    {'0/inner_state/inner_state/mu/w': 'nf4/block',
     '0/inner_state/inner_state/nu/w': 'ue4m0/block'}
  """
  _check_adaptive_state(state, 'bit_layout')
  out = {}

  def visit(node, prefix):
    for path, _, _, leaf in _leaf_slots(node):
      name = prefix + _SEGMENT + state_tree.path_str(path)
      out[name] = _layout_name(leaf.fmt, leaf.scale_mode)
    return node

  _map_adaptive(visit, state)
  return out


def bit_widths(state: Any) -> dict[str, float]:
  """Stored bits per element of every adapted leaf (codes and scales).

  Args:
    state: Any optimizer state (concrete or abstract) holding
      [`AdaptiveBitsState`][optax_q.AdaptiveBitsState] nodes.

  Returns:
    ``{'a/b/c' path: bits per element}`` from the real buffers, as
    [`bit_layout`][optax_q.bit_layout] names the leaves.

  Examples:
    >>> import jax.numpy as jnp, optax, optax_q
    >>> tx = optax.chain(
    ...     optax_q.adaptive_bits(optax.scale_by_adam(), min_size=0),
    ...     optax.scale_by_learning_rate(1e-3))
    >>> optax_q.bit_widths(tx.init({'w': jnp.zeros((8, 256))}))
    {'0/inner_state/inner_state/mu/w': 4.25,
     '0/inner_state/inner_state/nu/w': 4.25}
  """
  _check_adaptive_state(state, 'bit_widths')
  out = {}

  def visit(node, prefix):
    for path, _, _, leaf in _leaf_slots(node):
      name = prefix + _SEGMENT + state_tree.path_str(path)
      out[name] = 8.0 * leaf.nbytes / max(leaf.size, 1)
    return node

  _map_adaptive(visit, state)
  return out

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
"""Bit-level fingerprints of short optimizer runs, to compare revisions.

A fixed set of short, deterministic runs (a few jitted steps on a small
tree with numpy-seeded parameters and gradients, one leaf with gradients
near 1e4 and one near 1e-6) covers every drop-in optimizer, every format
family, both roundings, the scale modes, the XLA and Pallas (interpreted)
tile paths, resets, adaptive bits, ECO, quantized gradients and weights,
the ``optax_q.quant`` quantizers, and drop-ins sharded on a 4x2 mesh of 8
simulated CPU devices. Each run records a SHA-256 digest (dtype, shape and
raw bytes) of every leaf of its final state, of its last updates and of its
final parameters, plus one digest per step. Only the public API is used
(``optax_q`` and ``optax_q.quant``), so the same script runs at any revision
and two revisions that change no behaviour give the same file.

    python examples/fingerprint.py --out runs/fingerprint/before.json
    # ... at another revision:
    python examples/fingerprint.py --out runs/fingerprint/after.json
    python examples/fingerprint.py --compare runs/fingerprint/before.json \
        runs/fingerprint/after.json

``--compare`` prints the runs whose digests differ (and which leaves) and
exits with status 1 if any do, 0 otherwise. ``--quick`` runs a subset
(about a third), ``--runs REGEX`` the runs whose names match.
"""

from collections.abc import Callable, Sequence
import argparse
import dataclasses
import datetime
import hashlib
import json
import os
import pathlib
import re
import shlex
import subprocess
import sys
import time
from typing import Any
import warnings

_DEVICES = 8
if __name__ == '__main__':
  # Before jax is imported: the CPU backend reads the flag once, when it is
  # made. (Imported as a module, e.g. by the tests, the script changes
  # nothing.)
  os.environ['XLA_FLAGS'] = ' '.join(filter(None, (
      os.environ.get('XLA_FLAGS'),
      f'--xla_force_host_platform_device_count={_DEVICES}')))
  os.environ.setdefault('JAX_PLATFORMS', 'cpu')

# pylint: disable=g-import-not-at-top,wrong-import-position
import jax  # noqa: E402
from jax.sharding import NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402

# Run as `python examples/fingerprint.py` from a fresh clone: make the
# repository root importable even when the package is not installed.
ROOT = pathlib.Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
  sys.path.insert(0, str(ROOT))

import optax_q  # noqa: E402
# pylint: enable=g-import-not-at-top,wrong-import-position

STEPS = 4
LR = 1e-2
# name -> (shape, sharding on the ('data': 4, 'model': 2) mesh). 'w' is
# large enough for several blocks per row and, with a small tile size, for
# tiles of rows; 'b' and 'v' are short vectors ('v' of odd length, shorter
# than a block); 'big' and 'tiny' get gradients near 1e4 and 1e-6.
SHAPES = {
    'w': ((256, 384), P('data', 'model')),
    'b': ((96,), P('model')),
    'v': ((7,), P()),
    'big': ((64, 96), P('data', None)),
    'tiny': ((64, 96), P(None, 'model')),
}
GRAD_SCALE = {'big': 1e4, 'tiny': 1e-6}
# A parameter that the drop-ins' default tile size (2**18 elements) splits
# into tiles of rows: the runs of `kernel='xla'` and `'pallas'` add it.
HUGE = (640, 512)

# Every format family the codecs know; the second-moment runs use an
# unsigned or non-negative variant where the first-moment grid is signed only.
FORMATS = ('fp32', 'bf16', 'fp16', 'fp8_e4m3', 'fp8_e5m2', 'fp4_e2m1',
           'int8', 'int8_dynamic', 'int4', 'e3m2', 'nf4', 'nf3', 'int4_sqrt',
           'int3_sqrt', 'int4_mulaw', 'int3_mulaw', 'int4_softsign',
           'int3_softsign', 'fp8_e4m3_dre', 'fp8_e5m2_dre')
NU_ONLY_FORMATS = ('ue4m0', 'fp4_e2m2u', 'ue5m2')
NU_FOR = {'nf4': 'ue4m0', 'nf3': 'ue4m0'}
SCALE_MODES = ('block', 'block_pow2', 'row', 'tensor', 'rank1')
ROUNDINGS = ('nearest', 'stochastic')
# Formats whose adam run also rounds to nearest.
NEAREST_FORMATS = ('bf16', 'fp8_e4m3', 'int8_dynamic', 'int4', 'nf4',
                   'fp8_e4m3_dre')
# Formats whose codec runs also try every scale mode.
SCALE_MODE_FORMATS = ('int8', 'int4', 'fp8_e4m3', 'fp4_e2m1', 'nf4')


# ----------------------------------------------------------------------------
# Inputs.
# ----------------------------------------------------------------------------


def make_params(shapes: dict[str, tuple[int, ...]]) -> dict[str, np.ndarray]:
  """Float32 parameters, the same at every revision (numpy's PCG64)."""
  rng = np.random.default_rng(20260)
  return {name: (0.1 * rng.standard_normal(shape)).astype(np.float32)
          for name, shape in sorted(shapes.items())}


def make_grads(step: int, shapes: dict[str, tuple[int, ...]]
               ) -> dict[str, np.ndarray]:
  """Step ``step``'s gradients; 'big' near 1e4, 'tiny' near 1e-6."""
  rng = np.random.default_rng(1000 + step)
  grads = {}
  for name, shape in sorted(shapes.items()):
    g = rng.standard_normal(shape) * GRAD_SCALE.get(name, 1.0)
    grads[name] = g.astype(np.float32)
  return grads


def default_shapes(huge: bool = False) -> dict[str, tuple[int, ...]]:
  shapes = {name: shape for name, (shape, _) in SHAPES.items()}
  if huge:
    shapes['huge'] = HUGE
  return shapes


# ----------------------------------------------------------------------------
# Digests.
# ----------------------------------------------------------------------------


def _host(leaf: Any) -> np.ndarray:
  if isinstance(leaf, jax.Array) and jax.dtypes.issubdtype(
      leaf.dtype, jax.dtypes.prng_key):
    leaf = jax.random.key_data(leaf)
  return np.asarray(leaf)


def leaf_digest(leaf: Any) -> str:
  """SHA-256 (first 16 hex digits) of a leaf's dtype, shape and bytes."""
  a = np.ascontiguousarray(_host(leaf))
  h = hashlib.sha256()
  h.update(f'{a.dtype.str}|{a.dtype.name}|{a.shape}|'.encode())
  h.update(a.tobytes())
  return h.hexdigest()[:16]


def tree_digests(tree: Any) -> tuple[list[str], list[str]]:
  """(digest per leaf, path per leaf), in ``jax.tree.leaves`` order."""
  with_paths = jax.tree_util.tree_flatten_with_path(tree)[0]
  return ([leaf_digest(leaf) for _, leaf in with_paths],
          [jax.tree_util.keystr(path) for path, _ in with_paths])


def combined(digests: Sequence[str]) -> str:
  return hashlib.sha256('|'.join(digests).encode()).hexdigest()[:16]


def record(state: Any, updates: Any, params: Any,
           steps: Sequence[str]) -> dict[str, Any]:
  """A run's entry in the JSON."""
  out = {'steps': list(steps)}
  for field, tree in (('state', state), ('updates', updates),
                      ('params', params)):
    digests, paths = tree_digests(tree)
    out[field] = digests
    out[f'{field}_paths'] = paths
  return out


# ----------------------------------------------------------------------------
# Runners.
# ----------------------------------------------------------------------------


def run_tx(tx: optax.GradientTransformation, *, shapes=None,
           params=None, apply=optax.apply_updates,
           between: Callable[[Any, int], Any] | None = None,
           put: Callable[[Any], Any] = lambda t: t,
           init=None, step=None) -> dict[str, Any]:
  """``STEPS`` jitted updates of ``tx``; the digests of the run."""
  shapes = shapes or default_shapes()
  if params is None:
    params = make_params(shapes)
  params = put(jax.tree.map(np.asarray, params))

  def step_fn(p, s, g):
    u, s = tx.update(g, s, p)
    return apply(p, u), s, u

  init = init or jax.jit(tx.init)
  step = step or jax.jit(step_fn)
  state = init(params)
  updates, steps = None, []
  for i in range(STEPS):
    params, state, updates = step(params, state, put(make_grads(i, shapes)))
    steps.append(combined(tree_digests((updates, state))[0]))
    if between is not None:
      state = between(state, i + 1)
  return record(state, updates, params, steps)


def run_function(fn: Callable[[], Any]) -> dict[str, Any]:
  """A run of one pure function (no optimizer): the digests of its output."""
  out = fn()
  return record(out, (), (), [combined(tree_digests(out)[0])])


def run_sharded(make_tx: Callable[[], optax.GradientTransformation]
                ) -> dict[str, Any]:
  """``make_tx()`` on the 4x2 mesh: sharded init and step (via
  ``optax_q.state_shardings``); the digests of the gathered results."""
  if jax.device_count() < _DEVICES:
    raise RuntimeError(f'needs {_DEVICES} devices, found '
                       f'{jax.device_count()} (run the script itself)')
  mesh = jax.make_mesh((4, 2), ('data', 'model'),
                       axis_types=(jax.sharding.AxisType.Auto,) * 2)
  param_shardings = {n: NamedSharding(mesh, spec)
                     for n, (_, spec) in SHAPES.items()}
  tx = make_tx()
  params = make_params(default_shapes())
  abstract = jax.eval_shape(tx.init, params)
  shardings = optax_q.state_shardings(abstract, param_shardings)

  def step_fn(p, s, g):
    u, s = tx.update(g, s, p)
    return optax.apply_updates(p, u), s, u

  init = jax.jit(tx.init, in_shardings=(param_shardings,),
                 out_shardings=shardings)
  step = jax.jit(step_fn,
                 in_shardings=(param_shardings, shardings, param_shardings),
                 out_shardings=(param_shardings, shardings, param_shardings))
  return run_tx(tx, params=params,
                put=lambda t: jax.device_put(t, param_shardings),
                init=init, step=step)


# ----------------------------------------------------------------------------
# The runs.
# ----------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Run:
  name: str
  fn: Callable[[], dict[str, Any]]
  quick: bool = False


def _tx_run(name, make, quick=False, **kwargs) -> Run:
  return Run(name, lambda: run_tx(make(), **kwargs), quick)


def _then_lr(tx):
  return optax.chain(tx, optax.scale(-LR))


def _quiet(make):
  """``make`` with its warnings ignored (a run that warns on purpose)."""

  def quiet():
    with warnings.catch_warnings():
      warnings.simplefilter('ignore')
      return make()

  return quiet


def _relayout(state, step):
  return optax_q.relayout(state, step=step)


def _eco_run(inner, weight_format, *, rounding='stochastic',
             quantized_moments=False):
  def run():
    shapes = default_shapes()
    params = optax_q.quantize_params(
        jax.tree.map(np.asarray, make_params(shapes)), weight_format,
        filter='matrices', rounding='nearest')
    tx = optax_q.eco(inner(), weight_format, rounding=rounding, seed=3)
    if quantized_moments:
      tx = optax_q.quantize_state(tx, {'mu': 'int8', 'nu': 'fp8_e4m3'},
                                  min_size=0, block_size=32)
    return run_tx(tx, shapes=shapes, params=params,
                  apply=optax_q.apply_updates)
  return run


def _codec_run(fmt: str) -> Callable[[], dict[str, Any]]:
  """Every rounding (and for some formats every scale mode) of ``fmt``, on
  values spanning 1e-7 to 1e4, encoded and decoded in one jitted call."""
  rng = np.random.default_rng(7)
  x = rng.standard_normal((64, 384)).astype(np.float32)
  x[:16] *= 1e4
  x[16:32] *= 1e-6
  x[32, :7] = 0.0
  nonneg = fmt.startswith('u') or fmt == 'fp4_e2m2u'
  if nonneg:
    x = np.abs(x)
  modes = ((None, *SCALE_MODES) if fmt in SCALE_MODE_FORMATS else (None,))
  # Block sizes: the default and a small one; rank1 and row ignore it.
  combos = [(r, m, b) for r in ROUNDINGS for m in modes
            for b in ((128, 32) if m in (None, 'block') else (128,))]

  def fn(x):
    out = {}
    for rounding, mode, block in combos:
      q = optax_q.quantize(x, fmt, scale_mode=mode, block_size=block,
                           rounding=rounding, seed=5, step=3, stream=1)
      out[f'{rounding}/{mode}/{block}'] = (q, optax_q.dequantize(q))
    return out

  return lambda: run_function(lambda: jax.jit(fn)(x))


def _weights_run(fmt: str, rounding: str, scale_mode=None):
  def fn():
    params = jax.tree.map(np.asarray, make_params(default_shapes()))
    q = optax_q.quantize_params(params, fmt, filter='matrices',
                                rounding=rounding, seed=2,
                                scale_mode=scale_mode)
    fake = jax.jit(lambda p: optax_q.fake_quantize_params(
        p, fmt, filter='all', rounding=rounding, seed=2, step=1,
        scale_mode=scale_mode))(params)
    return q, optax_q.dequantize_params(q), fake
  return lambda: run_function(fn)


def _quant_run():
  quant = optax_q.quant  # Imports Flax and SciPy.
  rng = np.random.default_rng(11)
  w = (0.1 * rng.standard_normal((256, 384))).astype(np.float32)
  h = rng.standard_normal((32, 384)).astype(np.float32)
  out = {}
  for bits in (3, 4, 8):
    for granularity in ('row', 'tensor'):
      for grid in ('midrise', 'midtread'):
        q = quant.rtn(bits, granularity=granularity, grid=grid)
        out[f'rtn{bits}/{granularity}/{grid}'] = jax.jit(q.forward)(w)
    q = quant.quest(bits, hadamard_block=128)
    out[f'quest{bits}'] = jax.jit(q.forward)(w)
    out[f'gaussian_clip{bits}'] = np.float64(quant.gaussian_clip(bits))
  out['hadamard'] = quant.hadamard(128)
  out['kurtosis'] = quant.kurtosis(h)
  out['max_to_mean'] = quant.max_to_mean(h)
  out['max_to_median'] = quant.max_to_median(h)
  wq = out['rtn4/row/midrise'][0]
  out['linear_gain'] = quant.linear_gain(w, wq, h, h)
  out['relative_error'] = quant.relative_error(w, wq)
  return out


def make_runs() -> list[Run]:
  """Every run, in order; ``quick`` marks the subset of ``--quick``."""
  runs = []
  add = runs.append
  m0 = {'min_size': 0}

  # A drop-in with its defaults (min_size 4096: only 'w', 'big' and 'tiny'
  # are quantized), then the drop-ins with every leaf quantized. The
  # second-order ones precondition blocks of at most 128 (eigh on the
  # 384-wide blocks of 'w' would take most of the time).
  so = {'min_size': 0, 'precondition_frequency': 2,
        'max_preconditioner_dim': 128}
  add(_tx_run('adamw/defaults', lambda: optax_q.adamw(LR), quick=True))
  add(_tx_run('adamw', lambda: optax_q.adamw(LR, **m0), quick=True))
  add(_tx_run('adamw/nesterov_mask', lambda: optax_q.adamw(
      LR, weight_decay=0.1, mask=lambda p: {k: k != 'b' for k in p},
      nesterov=True, **m0)))
  add(_tx_run('adamw/track_stalls', lambda: optax_q.adamw(
      LR, track_stalls=True, **m0)))
  add(_tx_run('adamw/seed_block32', lambda: optax_q.adamw(
      LR, seed=123, block_size=32, **m0)))
  add(_tx_run('adamw/schedule', lambda: optax_q.adamw(
      optax.linear_schedule(LR, 0.0, STEPS), **m0)))
  add(_tx_run('adam', lambda: optax_q.adam(LR, **m0), quick=True))
  add(_tx_run('lion', lambda: optax_q.lion(LR, **m0), quick=True))
  add(_tx_run('lion/fp8_nearest', lambda: optax_q.lion(
      LR, mu_format='fp8_e4m3', rounding='nearest', **m0)))
  add(_tx_run('sgd/momentum', lambda: optax_q.sgd(LR, momentum=0.9, **m0),
              quick=True))
  add(_tx_run('sgd/nesterov_int4', lambda: optax_q.sgd(
      LR, momentum=0.9, nesterov=True, mu_format='int4', **m0)))
  add(_tx_run('sgd/plain', lambda: optax_q.sgd(LR, **m0)))
  add(_tx_run('muon', lambda: optax_q.muon(LR, **m0), quick=True))
  add(_tx_run('muon/int4_nearest', lambda: optax_q.muon(
      LR, mu_format='int4', adam_mu_format='fp8_e4m3',
      adam_nu_format='fp8_e4m3', rounding='nearest', block_size=64,
      weight_decay=0.01, **m0)))
  add(_tx_run('shampoo', lambda: optax_q.shampoo(LR, **so), quick=True))
  add(_tx_run('shampoo/int4_resets', lambda: optax_q.shampoo(
      LR, mu_format='int4', nu_format='int4', stats_format='fp8_e4m3',
      eigvecs_format='int8', rounding='nearest', reset_every=2, **so)))
  add(_tx_run('soap', lambda: optax_q.soap(LR, **so), quick=True))
  add(_tx_run('soap/fp8_resets', lambda: optax_q.soap(
      LR, mu_format='fp8_e4m3', nu_format='fp8_e4m3',
      stats_format='fp8_e4m3', weight_decay=0.01, reset_every=3, **so)))

  # Resets.
  add(_tx_run('adamw/reset_every2', lambda: optax_q.adamw(
      LR, reset_every=2, **m0), quick=True))
  add(_tx_run('adamw/reset_nu_fp8', _quiet(lambda: optax_q.adamw(
      LR, mu_format='fp8_e4m3', nu_format='fp8_e4m3', eps=1e-6,
      reset_every={'nu': 3}, **m0))))
  add(_tx_run('adamw/reset_adaptive', lambda: optax_q.adamw(
      LR, reset_every='adaptive', **m0)))
  add(_tx_run('adamw/reset_auto', lambda: optax_q.adamw(
      LR, nu_format='fp8_e4m3', reset_every='auto', **m0)))
  add(_tx_run('adam_with_resets', lambda: _then_lr(optax_q.adam_with_resets(
      2, formats={'mu': 'fp8_e4m3', 'nu': 'fp8_e4m3'}, **m0)), quick=True))
  add(_tx_run('reset_state', lambda: _then_lr(optax_q.reset_state(
      optax_q.scale_by_adam_local_age(), 2))))

  # Adaptive bits: period 1 and patience 1, so layouts may change in-run.
  # adamw/bits_adaptive is the chain that adamw(LR, bits={...}) built.
  add(_tx_run('adamw/bits_adaptive', lambda: optax.chain(
      optax_q.adaptive_bits(optax.scale_by_adam(), period=1, patience=1,
                            elementwise=True, track_stalls=False, **m0),
      optax.add_decayed_weights(1e-4), optax.scale_by_learning_rate(LR)),
              between=_relayout, quick=True))
  add(_tx_run('adaptive_bits', lambda: _then_lr(optax_q.adaptive_bits(
      optax.scale_by_adam(), period=1, patience=1, min_size=0)),
              between=_relayout))

  # Every format family in adam's moments, stochastic (the default); some
  # nearest too (the codec runs below round every format both ways).
  for fmt in FORMATS:
    nu = NU_FOR.get(fmt, fmt)
    for rounding in ROUNDINGS:
      if rounding == 'nearest' and fmt not in NEAREST_FORMATS:
        continue
      add(_tx_run(f'adam/format/{fmt}/{rounding}', (
          lambda fmt=fmt, nu=nu, rounding=rounding: optax_q.adam(
              LR, mu_format=fmt, nu_format=nu, rounding=rounding, **m0)),
                  quick=fmt in ('int8_dynamic', 'fp8_e4m3', 'nf4')
                  and rounding == 'stochastic'))
  for nu in NU_ONLY_FORMATS:
    add(_tx_run(f'adam/nu_format/{nu}', (
        lambda nu=nu: optax_q.adam(LR, mu_format='int8', nu_format=nu,
                                   **m0))))
  # Scale modes (one per moment too).
  for mode, fmt in (('block', 'fp8_e4m3'), ('block_pow2', 'int4'),
                    ('row', 'int4'), ('tensor', 'fp8_e4m3'),
                    ('rank1', 'int4')):
    add(_tx_run(f'adamw/scale_mode/{mode}/{fmt}', (
        lambda mode=mode, fmt=fmt: optax_q.adamw(
            LR, mu_format=fmt, nu_format=fmt, scale_mode=mode, **m0)),
                quick=mode == 'rank1'))
  add(_tx_run('adamw/scale_mode/per_moment', lambda: optax_q.adamw(
      LR, mu_format='fp4_e2m1', nu_format='fp4_e2m1',
      scale_mode={'mu': 'block_pow2', 'nu': 'rank1'}, **m0)))
  add(_tx_run('adamw/scale_mode/none_bf16', lambda: optax_q.adamw(
      LR, mu_format='bf16', nu_format='bf16', scale_mode='none', **m0)))

  # Tiles of rows: the XLA loop and the Pallas kernel (interpreted here).
  for kernel in ('xla', 'pallas'):
    for fmts in (('int4', 'fp8_e4m3'), ('int8_dynamic', 'int8_dynamic')):
      add(_tx_run(f'quantize_state/tiled/{kernel}/{fmts[0]}', (
          lambda kernel=kernel, fmts=fmts: _then_lr(optax_q.quantize_state(
              optax.scale_by_adam(), {'mu': fmts[0], 'nu': fmts[1]},
              rounding='stochastic', block_size=32, min_size=0,
              elementwise=True, tile_size=4096, track_stalls=False,
              kernel=kernel))), quick=fmts[0] == 'int4'))
    add(_tx_run(f'adamw/kernel/{kernel}', (
        lambda kernel=kernel: optax_q.adamw(
            LR, mu_format='int4', nu_format='fp8_e4m3', kernel=kernel,
            **m0)), shapes=default_shapes(huge=True)))

  # quantize_state on its own.
  add(_tx_run('quantize_state/scale_by_adam', lambda: _then_lr(
      optax_q.quantize_state(optax.scale_by_adam(), 'int8_dynamic',
                             min_size=0)), quick=True))
  add(_tx_run('quantize_state/dict_nearest', lambda: _then_lr(
      optax_q.quantize_state(
          optax.scale_by_adam(), {'mu': 'nf4', 'nu': 'ue4m0'},
          rounding={'mu': 'nearest', 'nu': 'stochastic'}, seed=9,
          min_size=0, block_size=64))))

  # Gradients, weights and the full framework of quantized training.
  add(_tx_run('quantize_gradients/e5m2', lambda: optax.chain(
      optax_q.quantize_gradients('e5m2'), optax.sgd(LR)), quick=True))
  add(_tx_run('quantize_gradients/int4_nearest', lambda: optax.chain(
      optax_q.quantize_gradients('int4', rounding='nearest', block_size=32),
      optax.sgd(LR))))

  def qt_run():
    q = optax_q.quantized_training(
        {'g': 'e5m2', 'w': 'e4m3', 'm': 'e4m3', 'v': 'e8m7'}, min_size=0)
    out = run_tx(q.optimizer(optax.adam(LR)))
    # The forward weights (q_W) at step 2, after the state's leaves.
    digests, paths = tree_digests(jax.jit(q.weights)(
        jax.tree.map(np.asarray, make_params(default_shapes())), 2))
    out['state'] += digests
    out['state_paths'] += [f'weights{p}' for p in paths]
    return out
  add(Run('quantized_training', qt_run, quick=True))

  add(Run('eco/adamw_fp8', _eco_run(
      lambda: optax.inject_hyperparams(optax.adamw)(LR), 'fp8_e4m3'),
          quick=True))
  add(Run('eco/sgd_bf16_nearest', _eco_run(
      lambda: optax.inject_hyperparams(optax.sgd)(LR, momentum=0.9), 'bf16',
      rounding='nearest')))
  add(Run('eco/adam_int4_quantized_moments', _eco_run(
      lambda: optax.inject_hyperparams(optax.adam)(LR), 'int4',
      quantized_moments=True)))

  for fmt, rounding, mode in (('fp8_e4m3', 'nearest', None),
                              ('int4', 'stochastic', None),
                              ('int8', 'nearest', 'block'),
                              ('bf16', 'stochastic', None),
                              ('fp4_e2m1', 'nearest', 'block_pow2')):
    add(Run(f'quantize_params/{fmt}/{rounding}/{mode}',
            _weights_run(fmt, rounding, mode), quick=fmt == 'int4'))

  # The codecs alone: every format, rounding and (for some) scale mode.
  for fmt in (*FORMATS, *NU_ONLY_FORMATS):
    add(Run(f'codec/{fmt}', _codec_run(fmt),
            quick=fmt in ('int4', 'fp8_e4m3', 'nf3')))

  add(Run('quant', lambda: run_function(_quant_run)))

  # Sharded on the 4x2 mesh.
  add(Run('sharded/adamw_int4_fp8', lambda: run_sharded(
      lambda: optax_q.adamw(LR, mu_format='int4', nu_format='fp8_e4m3',
                            block_size=32, **m0)), quick=True))
  add(Run('sharded/adamw_int8_dynamic_nearest', lambda: run_sharded(
      lambda: optax_q.adamw(LR, rounding='nearest', reset_every=2, **m0))))
  add(Run('sharded/lion', lambda: run_sharded(
      lambda: optax_q.lion(LR, **m0))))
  add(Run('sharded/muon', lambda: run_sharded(
      lambda: optax_q.muon(LR, **m0))))
  return runs


# ----------------------------------------------------------------------------
# Main.
# ----------------------------------------------------------------------------


def _git(*args: str) -> str:
  try:
    return subprocess.run(['git', *args], cwd=ROOT, capture_output=True,
                          text=True, check=True).stdout.strip()
  except (OSError, subprocess.CalledProcessError):
    return ''


def fingerprint(runs: Sequence[Run], argv: Sequence[str]) -> dict[str, Any]:
  """Runs ``runs``: the JSON document (meta and one entry per run)."""
  meta = {
      'command': shlex.join(['python', 'examples/fingerprint.py', *argv]),
      'revision': _git('rev-parse', '--short', 'HEAD'),
      'dirty': bool(_git('status', '--porcelain', '--untracked-files=no')),
      'date': datetime.datetime.now(datetime.timezone.utc).isoformat(
          timespec='seconds'),
      'jax': jax.__version__,
      'optax': optax.__version__,
      'numpy': np.__version__,
      'optax_q': optax_q.__version__,
      'devices': jax.device_count(),
      'steps': STEPS,
  }
  results, seconds = {}, {}
  for run in runs:
    t = time.perf_counter()
    try:
      results[run.name] = run.fn()
    except Exception as e:  # pylint: disable=broad-except
      # Recorded, not raised: an error is a difference like any other.
      results[run.name] = {'error': f'{type(e).__name__}: {e}'[:500]}
    seconds[run.name] = round(time.perf_counter() - t, 2)
    status = 'ERROR' if 'error' in results[run.name] else 'ok'
    print(f'{run.name:48s} {status:5s} {seconds[run.name]:6.2f}s',
          flush=True)
  meta['seconds'] = seconds
  return {'meta': meta, 'runs': results}


FIELDS = ('state', 'updates', 'params')


def compare(a: dict[str, Any], b: dict[str, Any], *,
            common: bool = False) -> list[str]:
  """Lines describing each run whose digests differ; empty if none.

  With ``common``, only the runs both files hold are compared.
  """
  lines = []
  runs_a, runs_b = a['runs'], b['runs']
  names = (runs_a.keys() & runs_b.keys() if common
           else runs_a.keys() | runs_b.keys())
  for name in sorted(names):
    if name not in runs_a or name not in runs_b:
      lines.append(f'{name}: only in {"A" if name in runs_a else "B"}')
      continue
    ra, rb = runs_a[name], runs_b[name]
    if 'error' in ra or 'error' in rb:
      if ra.get('error') != rb.get('error'):
        lines.append(f'{name}: error A={ra.get("error")!r} '
                     f'B={rb.get("error")!r}')
      continue
    details = []
    for field in FIELDS:
      da, db = ra[field], rb[field]
      paths = ra[f'{field}_paths']
      if len(da) != len(db):
        details.append(f'  {field}: {len(da)} leaves in A, {len(db)} in B')
      diff = [i for i, (x, y) in enumerate(zip(da, db)) if x != y]
      if diff:
        shown = ', '.join(f'{i} {paths[i]}' for i in diff[:12])
        more = f', ... ({len(diff)} in all)' if len(diff) > 12 else ''
        details.append(f'  {field}: leaves {shown}{more}')
    steps = [i for i, (x, y) in enumerate(zip(ra['steps'], rb['steps']))
             if x != y]
    if steps:
      details.append(f'  first differing step: {steps[0]}')
    if details:
      lines.append(f'{name}:')
      lines.extend(details)
    elif any(ra[f'{f}_paths'] != rb[f'{f}_paths'] for f in FIELDS):
      # The same bytes under other key paths (their text includes the
      # QArrays' layouts): printed, not counted.
      print(f'note: {name}: same digests, other key paths')
  return lines


def make_parser() -> argparse.ArgumentParser:
  parser = argparse.ArgumentParser(
      description=__doc__.split('\n\n', maxsplit=1)[0],
      formatter_class=argparse.ArgumentDefaultsHelpFormatter)
  parser.add_argument('--out',
                      default=str(ROOT / 'runs' / 'fingerprint' /
                                  'fingerprint.json'),
                      help='where to write the JSON of digests (its folder '
                      'is made; runs/ is git-ignored)')
  parser.add_argument('--quick', action='store_true',
                      help='run only the quick subset')
  parser.add_argument('--runs', metavar='REGEX', default=None,
                      help='run only the runs whose names match (re.search)')
  parser.add_argument('--list', action='store_true',
                      help='print the run names and exit')
  parser.add_argument('--compare', nargs=2, metavar=('A', 'B'), default=None,
                      help='compare two JSON files instead of running; '
                           'exit status 1 if any run differs')
  parser.add_argument('--common', action='store_true',
                      help='with --compare, skip the runs only one file '
                           'holds (a --quick file against a full one)')
  return parser


def main(argv: Sequence[str] | None = None) -> int:
  argv = sys.argv[1:] if argv is None else list(argv)
  args = make_parser().parse_args(argv)
  if args.compare:
    a, b = (json.loads(pathlib.Path(p).read_text()) for p in args.compare)
    for label, doc in (('A', a), ('B', b)):
      m = doc['meta']
      print(f'{label}: {m["revision"]}{" (dirty)" if m["dirty"] else ""} '
            f'{m["date"]} jax {m["jax"]}: {len(doc["runs"])} runs')
    lines = compare(a, b, common=args.common)
    if lines:
      print('\n'.join(lines))
      print(f'{sum(not l.startswith(" ") for l in lines)} runs differ.')
      return 1
    print('No run differs.')
    return 0

  runs = make_runs()
  if args.quick:
    runs = [r for r in runs if r.quick]
  if args.runs:
    runs = [r for r in runs if re.search(args.runs, r.name)]
  if args.list:
    print('\n'.join(r.name for r in runs))
    return 0
  t = time.perf_counter()
  doc = fingerprint(runs, argv)
  pathlib.Path(args.out).parent.mkdir(parents=True, exist_ok=True)
  pathlib.Path(args.out).write_text(json.dumps(doc, indent=1) + '\n')
  errors = [n for n, r in doc['runs'].items() if 'error' in r]
  print(f'{len(runs)} runs in {time.perf_counter() - t:.0f}s '
        f'({len(errors)} errors) -> {args.out}')
  return 0


if __name__ == '__main__':
  sys.exit(main())

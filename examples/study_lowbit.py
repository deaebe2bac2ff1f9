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
"""Low-bit codecs for Adam's moments: codec error and teacher-student training.

Two measurements, one results file (``lowbit.{json,md,png}``):

1. **Codec error** on synthetic arrays shaped like real moments: Gaussian
   and Student-t first moments, log-normal and mean-of-squares second
   moments, block 128 with float32 scales. Relative RMS error of the value,
   of ``sqrt(v)``, and of the Adam direction ``m / (sqrt(v) + eps)`` (the
   other moment exact), nearest and stochastic rounding; bits per element
   from the real buffers.
2. **Teacher-student regression**: a tanh MLP student 64-256-256-10 learns
   a fixed random tanh MLP teacher of the same shape (weights
   ``N(0, 4 / fan_in)``; full batch of 1024 normal inputs, mean squared
   error),
   AdamW b1 0.9, b2 0.999, eps 1e-8, weight decay 0.01, linear warm-up to
   1e-3 over 100 steps, 1500 steps; leaves under 4096 elements stay
   float32. Every configuration over the same seeds; the final training
   loss over fp32's (``optax.adamw``), seed by seed.

Beside the loss, each low-bit run reports its fidelity to a float32 AdamW
twin fed the same gradients (``optax_q.track_fidelity``): the median
update-norm ratio and update cosine, and the final weight distance. A lower
loss than float32's is not fidelity; the recommended states are chosen on
fidelity and learning-rate windows by ``examples/study_fidelity.py``.

  python examples/study_lowbit.py                      # runs/study_lowbit/
  python examples/study_lowbit.py --out docs/results   # the published page
"""

import argparse
import json
import pathlib
import statistics
import time

import _common  # pylint: disable=g-bad-import-order
import jax
import jax.numpy as jnp
import numpy as np
import optax
import optax_q

BLOCK = 128
EPS = 1e-8
SIZES = (64, 256, 256, 10)  # The teacher's and the student's MLP.
# A name ending in ' pow2' uses shared power-of-two scales (one byte per
# block) instead of float32 ones, one ending in ' rank1' rank-1
# normalisation (a float32 maximum per row and per column, Li et al. 2023);
# '<fp8>_dre' is fp8 with dynamic range expansion (COAT).
FIRST = ('int4', 'fp4_e2m1', 'nf4', 'nf4 pow2', 'int4_sqrt', 'int4_softsign',
         'int4_mulaw', 'nf3', 'nf3 pow2', 'int3_sqrt', 'int3_softsign',
         'fp8_e4m3', 'fp8_e4m3 pow2', 'fp8_e4m3_dre', 'fp8_e5m2',
         'fp8_e5m2_dre', 'int8_dynamic')
SECOND = ('int4', 'fp4_e2m1', 'ue4m0', 'ue4m0@rsqrt', 'ue4m0@log', 'ue3m1',
          'ue3m1@rsqrt', 'int4_sqrt', 'int4_mulaw', 'int4_softsign',
          'ue4m0 pow2', 'int4_mulaw pow2', 'ue3m0', 'ue3m0@rsqrt', 'ue2m1',
          'int3_sqrt', 'int3_mulaw', 'int3_mulaw pow2', 'int4 rank1',
          'fp4_e2m1 rank1', 'ue4m0 rank1', 'int4_mulaw rank1', 'ue3m0 rank1',
          'int3_mulaw rank1', 'fp8_e4m3', 'fp8_e4m3_dre', 'int8_dynamic')
RANK1_NU = {'nu': 'rank1'}  # Rank-1 second moment, blocks for the first.
# (name, mu format, nu format, resets[, scale mode]). Resets 'model': both
# moments every
# K* steps of the stall model for the second moment's grid (rounded
# linearly), resolved to an int before the run.
CONFIGS = (
    ('fp32', None, None, None),
    ('int8_dynamic', 'int8_dynamic', 'int8_dynamic', None),
    ('fp8_e4m3', 'fp8_e4m3', 'fp8_e4m3', None),
    ('4bit (fp4_e2m1 + fp4_e2m2u)', 'fp4_e2m1', 'fp4_e2m1', None),
    ('int4', 'int4', 'int4', None),
    ('nf4 + int8_dynamic', 'nf4', 'int8_dynamic', None),
    ('nf4 + ue4m0', 'nf4', 'ue4m0', None),
    ('nf4 + ue4m0@rsqrt', 'nf4', 'ue4m0@rsqrt', None),
    ('nf4 + ue4m0@log', 'nf4', 'ue4m0@log', None),
    ('nf4 + ue3m1', 'nf4', 'ue3m1', None),
    ('nf4 + ue3m1@rsqrt', 'nf4', 'ue3m1@rsqrt', None),
    ('nf4 + int4_sqrt', 'nf4', 'int4_sqrt', None),
    ('nf4 + int4_mulaw', 'nf4', 'int4_mulaw', None),
    ('int4_softsign + ue4m0@rsqrt', 'int4_softsign', 'ue4m0@rsqrt', None),
    ('fp4_e2m1 + ue4m0@rsqrt', 'fp4_e2m1', 'ue4m0@rsqrt', None),
    ('nf4 + ue4m0@rsqrt, resets', 'nf4', 'ue4m0@rsqrt', 'model'),
    ('nf3 + ue3m0', 'nf3', 'ue3m0', None),
    ('nf3 + ue3m0@rsqrt', 'nf3', 'ue3m0@rsqrt', None),
    ('nf3 + int3_mulaw', 'nf3', 'int3_mulaw', None),
    ('int3_softsign + ue3m0@rsqrt', 'int3_softsign', 'ue3m0@rsqrt', None),
    ('nf3 + ue3m0@rsqrt, resets', 'nf3', 'ue3m0@rsqrt', 'model'),
    ('nf4 + ue4m0, pow2 scales', 'nf4', 'ue4m0', None, 'block_pow2'),
    ('nf4 + int4_mulaw, pow2 scales', 'nf4', 'int4_mulaw', None,
     'block_pow2'),
    ('nf3 + int3_mulaw, pow2 scales', 'nf3', 'int3_mulaw', None,
     'block_pow2'),
    ('fp8_e4m3_dre', 'fp8_e4m3_dre', 'fp8_e4m3_dre', None),
    ('int4, rank-1 nu', 'int4', 'int4', None, RANK1_NU),
    ('nf4 + fp4_e2m2u, rank-1 nu', 'nf4', 'fp4_e2m1', None, RANK1_NU),
    ('nf4 + ue4m0, rank-1 nu', 'nf4', 'ue4m0', None, RANK1_NU),
    ('nf4 + int4_mulaw, rank-1 nu', 'nf4', 'int4_mulaw', None, RANK1_NU),
    ('nf3 + ue3m0, rank-1 nu', 'nf3', 'ue3m0', None, RANK1_NU),
    ('nf3 + int3_mulaw, rank-1 nu', 'nf3', 'int3_mulaw', None, RANK1_NU),
    # The recommended states (study_fidelity.py): the second moment rounded
    # in Adam's preconditioner space, as rounding='preconditioner' does.
    ('nf4 + int4_mulaw, preconditioner rounding', 'nf4',
     f'int4_mulaw@rsqrt+{EPS!r}', None),
    ('nf3 + int3_mulaw, preconditioner rounding', 'nf3',
     f'int3_mulaw@rsqrt+{EPS!r}', None),
)


# ----------------------------------------------------------------------------
# 1. Codec error.
# ----------------------------------------------------------------------------


def synthetic_moments(seed: int, shape=(256, 1024)):
  """Named first and second moments, and a matched pair for directions."""
  rng = np.random.default_rng(seed)
  sigma = np.exp(rng.normal(-7.0, 1.0, shape))  # per-coordinate gradient scale
  g = rng.standard_t(3, (16,) + shape) * sigma
  f32 = lambda x: jnp.asarray(x, jnp.float32)
  first = {'gaussian': f32(rng.normal(0, 1, shape)),
           'student_t3': f32(rng.standard_t(3, shape))}
  second = {'log_normal': f32(np.exp(rng.normal(-14.0, 2.0, shape))),
            'mean_of_squares': f32(np.mean(g * g, axis=0))}
  # Adam's direction: m ~ sqrt(v) z, so |m / sqrt(v)| is of order one.
  v = second['mean_of_squares']
  m = jnp.sqrt(v) * f32(rng.normal(0, 0.3, shape))
  return first, second, (m, v)


def _rel(a, b):
  return float(jnp.sqrt(jnp.mean((a - b) ** 2) / jnp.mean(b * b)))


def _roundtrip(x, fmt, rounding, nonnegative):
  fmt, _, mode = fmt.partition(' ')
  fmt = optax_q.unsigned_variant(fmt) if nonnegative else optax_q.get_format(
      fmt)
  q = optax_q.quantize(x, fmt, block_size=BLOCK, rounding=rounding, seed=1,
                       scale_mode={'pow2': 'block_pow2', 'rank1': 'rank1',
                                   '': 'block'}[mode])
  return (optax_q.dequantize(q), 8 * q.nbytes / x.size,
          fmt.name + (f' {mode}' if mode else ''))


def codec_error(seed: int = 0, shape=(256, 1024)):
  """Rows of codec error for every first- and second-moment format."""
  first, second, (m, v) = synthetic_moments(seed, shape)
  direction = m / (jnp.sqrt(v) + EPS)
  rows = []
  for rounding in ('nearest', 'stochastic'):
    for fmt in FIRST:
      row = dict(moment='first', format=fmt, rounding=rounding)
      for name, x in first.items():
        row[name], row['bits'], row['stored_as'] = _roundtrip(
            x, fmt, rounding, False)
        row[name] = _rel(row[name], x)
      mq, _, _ = _roundtrip(m, fmt, rounding, False)
      row['direction'] = _rel(mq / (jnp.sqrt(v) + EPS), direction)
      rows.append(row)
    for fmt in SECOND:
      row = dict(moment='second', format=fmt, rounding=rounding)
      for name, x in second.items():
        xq, row['bits'], row['stored_as'] = _roundtrip(x, fmt, rounding, True)
        row[name] = _rel(xq, x)
        row[name + '_sqrt'] = _rel(jnp.sqrt(xq), jnp.sqrt(x))
      vq, _, _ = _roundtrip(v, fmt, rounding, True)
      row['direction'] = _rel(m / (jnp.sqrt(vq) + EPS), direction)
      rows.append(row)
  return rows


# ----------------------------------------------------------------------------
# 2. Teacher-student regression.
# ----------------------------------------------------------------------------


def mlp(params, x):
  """A tanh MLP of ``[(w, b), ...]`` (no activation after the last)."""
  for w, b in params[:-1]:
    x = jnp.tanh(x @ w + b)
  w, b = params[-1]
  return x @ w + b


def init_mlp(key, sizes=SIZES, gain=1.0):
  """``[(w, b), ...]`` of ``sizes``: ``w ~ N(0, gain^2 / fan_in)``, zero
  ``b``."""
  params = []
  for k, (n_in, n_out) in zip(jax.random.split(key, len(sizes) - 1),
                              zip(sizes[:-1], sizes[1:])):
    w = jax.random.normal(k, (n_in, n_out)) * gain / np.sqrt(n_in)
    params.append((w, jnp.zeros((n_out,))))
  return params


def teacher_student_data(seed: int, batch: int = 1024):
  """(student params, inputs, teacher outputs) of one seed's problem."""
  kt, ks, kx = jax.random.split(jax.random.key(seed), 3)
  x = jax.random.normal(kx, (batch, SIZES[0]))
  return init_mlp(ks), x, mlp(init_mlp(kt, gain=2.0), x)


def mse(params, x, y):
  """The student's mean squared error on the teacher's outputs."""
  return jnp.mean((mlp(params, x) - y) ** 2)


def teacher_student_problem(seed: int, batch: int = 1024):
  """(student params, loss function) of one seed's problem."""
  params, x, y = teacher_student_data(seed, batch)
  return params, lambda p: mse(p, x, y)


def make_optimizer(mu, nu, resets, *, seed, scale_mode=None):
  lr = optax.linear_schedule(0.0, 1e-3, 100)
  kw = dict(b1=0.9, b2=0.999, eps=EPS, weight_decay=0.01)
  if mu is None:
    return optax.adamw(lr, **kw)
  return optax_q.adamw(lr, **kw, mu_format=mu, nu_format=nu,
                       rounding='stochastic', seed=seed, reset_every=resets,
                       scale_mode=scale_mode)


def resolve_resets(nu, resets):
  if resets == 'model':
    return optax_q.reset_period(nu.split('@')[0], b2=0.999)
  return resets


def train_teacher_student(mu, nu, resets, seed, steps, scale_mode=None):
  """One run; a low-bit one beside its float32 twin (`track_fidelity`)."""
  params, loss = teacher_student_problem(seed)
  tx = make_optimizer(mu, nu, resets, seed=seed, scale_mode=scale_mode)
  if mu is not None:
    tx = optax_q.track_fidelity(tx, make_optimizer(None, None, None, seed=0),
                                steps=steps)
  state = tx.init(params)

  @jax.jit
  def step(params, state):
    value, grads = jax.value_and_grad(loss)(params)
    updates, state = tx.update(grads, state, params)
    return optax.apply_updates(params, updates), state, value

  for _ in range(steps):
    params, state, _ = step(params, state)
  moments = sum(x.size for x in jax.tree.leaves(params))
  fidelity = (dict(_common.BASELINE_FIDELITY) if mu is None
              else _common.fidelity_fields(state))
  state = _common.inner_state(state)  # Not the twin's float32 state.
  return dict(final_loss=float(loss(params)), **fidelity,
              state_bits_per_element=float(
                  optax_q.state_bits_per_element(state)),
              quantized_bits_per_element=float(
                  optax_q.state_bits_per_element(state, quantized_only=True)),
              state_bytes=int(optax_q.state_nbytes(state)),
              moment_elements=2 * moments)


def teacher_student(seeds, steps, configs=CONFIGS, log=print):
  rows = []
  for seed in seeds:
    for name, mu, nu, resets, *scale in configs:
      t0 = time.perf_counter()
      resets = resolve_resets(nu, resets)
      scale_mode = scale[0] if scale else None
      row = dict(config=name, mu_format=mu, nu_format=nu, reset_every=resets,
                 scale_mode=scale_mode, seed=seed,
                 **train_teacher_student(mu, nu, resets, seed, steps,
                                         scale_mode))
      row['seconds'] = round(time.perf_counter() - t0, 1)
      rows.append(row)
      log(f'{name:32s} seed {seed}: loss {row["final_loss"]:.3e}, '
          f'{row["state_bits_per_element"]:.2f} bits, norm ratio '
          f'{row["norm_ratio"]:.3f}, cosine {row["cosine"]:.3f} '
          f'({row["seconds"]} s)')
  return rows


# Peers on the same problem (optional: each row is skipped, with a note,
# when its package does not import). The data, teacher and student's initial
# weights are the JAX problem's, copied into PyTorch.
PEERS = ('torch.optim.AdamW', 'torchao AdamW8bit', 'torchao AdamW4bit')


def _torch_optimizer(name, params):
  import torch  # pylint: disable=g-import-not-at-top
  kw = dict(lr=1e-3, betas=(0.9, 0.999), eps=EPS, weight_decay=0.01)
  if name == 'torch.optim.AdamW':
    return torch.optim.AdamW(params, **kw)
  import torchao.optim  # pylint: disable=g-import-not-at-top
  return getattr(torchao.optim, name.split()[1])(params, **kw)


def train_teacher_student_torch(name, seed, steps):
  """The teacher-student run of ``seed`` with a PyTorch optimizer."""
  import torch  # pylint: disable=g-import-not-at-top
  student, x, y = teacher_student_data(seed)
  t = lambda a: torch.tensor(np.asarray(a), dtype=torch.float32)
  xt, yt = t(x), t(y)
  params = [torch.nn.Parameter(t(a)) for layer in student for a in layer]

  def loss():
    h = xt
    for i in range(0, len(params) - 2, 2):
      h = torch.tanh(h @ params[i] + params[i + 1])
    return torch.mean((h @ params[-2] + params[-1] - yt) ** 2)

  opt = _torch_optimizer(name, params)
  warmup = torch.optim.lr_scheduler.LambdaLR(
      opt, lambda i: min(i, 100) / 100)  # optax.linear_schedule(0, 1e-3, 100)
  for _ in range(steps):
    opt.zero_grad()
    loss().backward()
    opt.step()
    warmup.step()
  state_bytes = _common.torch_state_bytes(opt)
  moments = 2 * sum(p.numel() for p in params)
  with torch.no_grad():
    return dict(final_loss=float(loss()), state_bytes=state_bytes,
                state_bits_per_element=8 * state_bytes / moments,
                quantized_bits_per_element=None, moment_elements=moments)


def teacher_student_peers(seeds, steps, log=print):
  """Rows of the peers that import and run here; notes for the others."""
  rows, notes = [], {}
  for name in PEERS:
    try:
      for seed in seeds:
        t0 = time.perf_counter()
        row = dict(config=name, mu_format=None, nu_format=None,
                   reset_every=None, scale_mode=None, seed=seed, peer=True,
                   **train_teacher_student_torch(name, seed, steps))
        row['seconds'] = round(time.perf_counter() - t0, 1)
        rows.append(row)
        log(f'{name:32s} seed {seed}: loss {row["final_loss"]:.3e} '
            f'({row["seconds"]} s)')
    except Exception as e:  # pylint: disable=broad-except
      notes[name] = f'skipped: {type(e).__name__}: {str(e)[:200]}'
      rows = [r for r in rows if r['config'] != name]
      log(f'{name}: {notes[name]}')
  return rows, notes


def summarize(rows):
  """Per configuration: mean loss, the paired ratio to fp32, bits."""
  base = {r['seed']: r['final_loss'] for r in rows if r['config'] == 'fp32'}
  out = {}
  for r in rows:
    s = out.setdefault(r['config'], dict(
        config=r['config'], mu_format=r['mu_format'],
        nu_format=r['nu_format'], reset_every=r['reset_every'],
        scale_mode=r.get('scale_mode'),
        bits=r['quantized_bits_per_element'],
        all_bits=r['state_bits_per_element'], losses=[], ratios=[]))
    s['losses'].append(r['final_loss'])
    s['ratios'].append(r['final_loss'] / base[r['seed']])
  for s in out.values():
    s.update(_common.fidelity_means(
        [r for r in rows if r['config'] == s['config']]))
    if s['bits'] != s['bits']:  # No quantized leaf (fp32): NaN.
      s['bits'] = None
    s['mean_loss'] = statistics.fmean(s['losses'])
    s['ratio'] = statistics.fmean(s['ratios'])
    s['ratio_max'] = max(s['ratios'])
  return list(out.values())


# ----------------------------------------------------------------------------
# Output.
# ----------------------------------------------------------------------------


def _plot(path, summary):
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use('Agg')
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  rows = sorted(summary, key=lambda s: (-s['all_bits'], -s['ratio']))
  bits = [s['all_bits'] for s in rows]
  palette = plt.get_cmap('viridis')
  levels = sorted(set(bits))
  colors = [palette(levels.index(b) / max(1, len(levels) - 1)) for b in bits]
  fig, ax = plt.subplots(figsize=(7.5, 0.28 * len(rows) + 1.2))
  ax.barh(range(len(rows)), [s['ratio'] for s in rows], color=colors,
          left=0)
  ax.set_yticks(range(len(rows)))
  ax.set_yticklabels([f'{s["config"]}  ({b:.2f} bits)'
                      for s, b in zip(rows, bits)], fontsize=7)
  ax.axvline(1.0, color='k', lw=0.6)
  ax.axvline(1.1, color='k', lw=0.6, ls='--', label='target: 1.1x fp32')
  ax.set_xscale('log')
  ax.set_xlabel('final loss / fp32, mean over seeds (log scale)')
  ax.set_title('Teacher-student regression, AdamW, 1500 steps\n(bits per '
               'moment element, scales and float32 small leaves included)',
               fontsize=8)
  ax.legend(fontsize=7, loc='lower right')
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)


def _codec_tables(rows):
  first = [(r['format'], r['stored_as'], r['rounding'], f'{r["bits"]:.3f}',
            f'{r["gaussian"]:.3f}', f'{r["student_t3"]:.3f}',
            f'{r["direction"]:.3f}')
           for r in rows if r['moment'] == 'first']
  second = [(r['format'], r['stored_as'], r['rounding'], f'{r["bits"]:.3f}',
             f'{r["log_normal"]:.3f}', f'{r["log_normal_sqrt"]:.3f}',
             f'{r["mean_of_squares_sqrt"]:.3f}', f'{r["direction"]:.3f}')
            for r in rows if r['moment'] == 'second']
  head = ('format', 'stored as', 'rounding', 'bits/elem')
  return (_common.markdown_table(
      head + ('gaussian', 'student-t', 'direction'), first),
          _common.markdown_table(
              head + ('log-normal', 'sqrt log-normal',
                      'sqrt mean-of-squares', 'direction'), second))


def _bits(x):
  return '-' if x is None or x != x else f'{x:.3f}'


def render_markdown(result):
  meta = result['meta']
  first, second = _codec_tables(result['codec_error'])
  train = [(s['config'], _bits(s['bits']), f'{s["all_bits"]:.2f}',
            f'{s["mean_loss"]:.3e}', f'{s["ratio"]:.2f}',
            f'{s["ratio_max"]:.2f}',
            *(_bits(s.get(key)) for key in _common.FIDELITY))
           for s in result['summary']]
  notes = ''.join(f'\n- {k}: {v}' for k, v in
                  meta.get('peer_notes', {}).items())
  earlier = ''.join(
      f"\n- Rows of the other configurations (and the peers) from: "
      f"`{e['command']}` (revision `{e['git_revision']}`, {e['date']})"
      for e in meta.get('earlier', []))
  return f"""# Low-bit codecs: codec error and teacher-student training

Written by `examples/study_lowbit.py`; do not edit.

- Command: `{meta['command']}`
- Revision: `{meta['git_revision']}`; date: {meta['date']}
- Machine: {meta['machine']}
- Seeds: {meta['seeds']}; {meta['steps']} steps; {meta['seconds']:.0f} s{earlier}

The recommended 4- and 3-bit states are chosen on fidelity and
learning-rate windows, on three problems, by `examples/study_fidelity.py`
([results](fidelity.md)).

## Teacher-student regression

Final training loss, and its ratio to `optax.adamw` in float32 seed by seed
(mean and worst over seeds), beside the run's fidelity to a float32 AdamW
twin fed the same gradients (`optax_q.track_fidelity`, mean over seeds):
the median over steps of the update-norm ratio (above one: larger steps
than float32's) and of the update cosine, and the final distance from the
twin's weights relative to how far the twin moved. A loss below float32's
with a norm ratio above one is a larger effective learning rate, not more
precision. Bits per element from the real buffers
(`optax_q.state_bits_per_element`), scales included: over the quantized
moments, and over all moments
(the float32 leaves under 4096 elements included). The peers (PyTorch,
torchao) train the same problem from the same data and initial weights,
copied into PyTorch, with the same hyperparameters; their loss is divided by
`optax.adamw`'s too.{notes}

![bits against loss](lowbit.png)

{_common.markdown_table(('config', 'bits/elem (quantized)', 'bits/elem (all)', 'mean loss', 'x fp32', 'worst x fp32', 'norm ratio', 'cosine', 'weight distance'), train)}

## Codec error

Relative RMS error after one encode (block {BLOCK}, float32 scales). First
moments: Gaussian and Student-t (3 degrees of freedom) values, and the Adam
direction `m / (sqrt(v) + eps)` with the second moment exact. Second
moments (stored in the format's unsigned variant): log-normal
`exp(N(-14, 2))` values and their square roots, the square root of a mean of
16 squared Student-t gradients of log-normal scale, and the Adam direction
with the first moment exact. In the direction pair `m = sqrt(v) z`, `z ~
N(0, 0.3^2)`, so a block's first moments span the range of its second
moments'.

First moments:

{first}

Second moments:

{second}
"""


def make_parser():
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0],
                                   formatter_class=_common.HelpFormatter)
  parser.add_argument('--seeds', type=int, nargs='+', default=[0, 1, 2],
                      help='seeds of the training runs')
  parser.add_argument('--steps', type=int, default=1500,
                      help='training steps of each run')
  parser.add_argument('--only', nargs='*', default=None,
                      help='train only these configurations, and fp32 '
                      '(default: all)')
  parser.add_argument('--no-peers', action='store_true',
                      help='skip the PyTorch, torchao rows')
  parser.add_argument('--codec-shape', type=int, nargs=2, default=[256, 1024],
                      help='shape of the synthetic moments of the codec '
                      'error table')
  _common.add_out_argument(parser, __file__)
  parser.add_argument('--merge', action='store_true',
                      help='with --only: replace the rows of these '
                      'configurations (and fp32, which is deterministic) in '
                      'the lowbit.json in --out and keep the others; the '
                      'codec table is measured anew; the command is added '
                      'to the file\'s list of commands')
  parser.add_argument('--render', action='store_true',
                      help='only re-write lowbit.{json,md,png} from the '
                      'lowbit.json in --out (no measurement)')
  return parser


def main(argv=None):
  args = make_parser().parse_args(argv)
  out = pathlib.Path(args.out)
  if args.render:
    result = json.loads((out / 'lowbit.json').read_text())
    result['summary'] = summarize(result['rows'])
    for key in ('recommended', 'recommended_4bit', 'recommended_3bit'):
      result.pop(key, None)  # Chosen by study_fidelity.py now.
    return _write(out, result)
  out.mkdir(parents=True, exist_ok=True)
  t0 = time.perf_counter()
  meta = dict(command=_common.command_line(__file__, argv),
              git_revision=_common.git_revision(), date=_common.now_utc(),
              machine=_common.machine(), seeds=args.seeds, steps=args.steps,
              codec_shape=args.codec_shape)
  if args.merge and args.only is None:
    raise SystemExit('--merge needs --only')
  configs = [c for c in CONFIGS
             if args.only is None or c[0] == 'fp32' or c[0] in args.only]
  unknown = sorted(set(args.only or ()) - {c[0] for c in CONFIGS})
  if unknown:
    raise SystemExit(f'--only: unknown configurations {unknown}')
  codec = codec_error(shape=tuple(args.codec_shape))
  rows = teacher_student(args.seeds, args.steps, configs)
  notes = {}
  if not args.no_peers:
    peer_rows, notes = teacher_student_peers(args.seeds, args.steps)
    rows += peer_rows
  meta['peer_notes'] = notes
  if args.merge:
    rows, meta = _merged(out, rows, meta, args)
  summary = summarize(rows)
  meta['seconds'] = time.perf_counter() - t0
  result = dict(meta=meta, summary=summary,
                rows=rows, codec_error=codec)
  return _write(out, result)


def _merged(out, rows, meta, args):
  """``rows`` in place of the same configurations' rows of the published
  file, the others kept (with the commands that measured them)."""
  old = json.loads((out / 'lowbit.json').read_text())
  if old['meta']['seeds'] != args.seeds or old['meta']['steps'] != args.steps:
    raise SystemExit('--merge: seeds and steps must be those of the file')
  fresh = {r['config'] for r in rows}
  kept = [r for r in old['rows'] if r['config'] not in fresh]
  earlier = old['meta'].get('earlier', [])
  earlier.append({k: old['meta'][k] for k in
                  ('command', 'git_revision', 'date', 'seconds')
                  if k in old['meta']})
  meta['earlier'] = earlier
  meta['peer_notes'] = old['meta'].get('peer_notes', {})
  order = [c[0] for c in CONFIGS]
  merged = kept + rows
  merged.sort(key=lambda r: (r['seed'], order.index(r['config'])
                             if r['config'] in order else len(order)))
  return merged, meta


def _write(out, result):
  for row in result['rows']:  # fp32 has no quantized leaf: null, not NaN.
    bits = row['quantized_bits_per_element']
    row['quantized_bits_per_element'] = None if bits != bits else bits
  (out / 'lowbit.json').write_text(
      json.dumps(result, indent=1, allow_nan=False) + '\n')
  _plot(out / 'lowbit.png', result['summary'])
  (out / 'lowbit.md').write_text(render_markdown(result))
  print(f'wrote {out}/lowbit.{{json,md,png}}')
  return result


if __name__ == '__main__':
  main()

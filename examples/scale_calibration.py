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
r"""Does EDEN-style block-scale calibration make a low-bit first moment
more faithful?

EDEN (Vargaftik et al., 2022) rescales a quantized vector so that its
projection on the original is exact: a block `x` quantized to `Q(x)` is
stored with its scale multiplied by

```tex
c = \frac{\|x\|^2}{\langle x, Q(x) \rangle},
```

which removes the systematic shrinkage of round-to-nearest on coarse grids.
Li et al. (2026, "Rounding in Preconditioner Space") calibrate the block
scales of their 4-bit AdamW this way. This script measures whether it helps
the first moment here: AdamW on the low-bit study's teacher-student problem
(1500 steps, 3 seeds, ``optax.adamw`` with b1 0.9, b2 0.999, eps 1e-8,
weight decay 0.01), whose first moment is stored after every step as
``nf4`` or ``nf3`` codes in blocks of 128 (the library's codec, leaves of at
least 4096 elements), rounded to nearest or stochastically, with and
without the calibration; the second moment stays float32, so the first
moment is all that differs from the float32 twin the run is compared with
(``optax_q.track_fidelity``: update-norm ratio and cosine, medians over the
steps, and the final weight distance).

  python examples/scale_calibration.py      # into runs/scale_calibration/
  python examples/scale_calibration.py --out docs/results  # published
"""

import argparse
import json
import pathlib
import statistics
import time
import zlib

import _common  # pylint: disable=g-bad-import-order
import jax
import jax.numpy as jnp
import optax
import study_lowbit

from optax_q._src.codec import formats
from optax_q._src.codec import qarray

optax_q = _common.optax_q
BLOCK = 128
MIN_SIZE = 4096
FORMATS = ('nf4', 'nf3')
ROUNDINGS = ('nearest', 'stochastic')


def calibrated_round_trip(x, fmt, key, calibrate):
  """``x`` encoded in blocks (``key``: stochastic rounding) and decoded,
  each block rescaled by `c` when ``calibrate`` (1 where `c` is undefined).
  Decoding a stored scale of `c` times the absmax scale gives the same
  values up to one float32 rounding."""
  q = qarray.encode(x, fmt, scale_mode='block', block_size=BLOCK, key=key)
  decoded = qarray.decode(q)
  if not calibrate:
    return decoded
  # pylint: disable=protected-access
  xb = qarray._blocked(x, 'block', BLOCK)
  db = qarray._blocked(decoded, 'block', BLOCK)
  dot = jnp.sum(xb * db, axis=-1, keepdims=True)
  ok = dot > 0
  c = jnp.where(ok, jnp.sum(xb * xb, axis=-1, keepdims=True)
                / jnp.where(ok, dot, 1.0), 1.0)
  return qarray._unblocked(db * c, x)
  # pylint: enable=protected-access


def stored_first_moment(tx, fmt, rounding, calibrate, seed):
  """``tx`` (an ``optax.adamw``) whose first moment is stored quantized:
  the update uses the exact new moment, the state keeps its round trip."""
  fmt = formats.get_format(fmt)

  def update(updates, state, params=None):
    updates, state = tx.update(updates, state, params)
    count = state[0].count  # optax.adamw's ScaleByAdamState comes first.
    key = jax.random.fold_in(jax.random.key(seed), count)

    def store(path, x):
      if x.size < MIN_SIZE:
        return x
      leaf = zlib.crc32(jax.tree_util.keystr(path).encode()) % 2**31
      bits = (None if rounding == 'nearest' else jax.random.bits(
          jax.random.fold_in(key, leaf), (), jnp.uint32))
      return calibrated_round_trip(x, fmt, bits, calibrate)

    mu = jax.tree_util.tree_map_with_path(
        store, optax.tree_utils.tree_get(state, 'mu'))
    return updates, optax.tree_utils.tree_set(state, mu=mu)

  return optax.GradientTransformation(tx.init, update)


def run(fmt, rounding, calibrate, seed, steps):
  params, loss = study_lowbit.teacher_student_problem(seed)
  adamw = study_lowbit.make_optimizer(None, None, None, seed=seed)
  tx = optax_q.track_fidelity(
      stored_first_moment(adamw, fmt, rounding, calibrate, seed), adamw,
      steps=steps)
  state = tx.init(params)

  @jax.jit
  def step(params, state):
    grads = jax.grad(loss)(params)
    updates, state = tx.update(grads, state, params)
    return optax.apply_updates(params, updates), state

  for _ in range(steps):
    params, state = step(params, state)
  return dict(format=fmt, rounding=rounding, calibrated=calibrate, seed=seed,
              final_loss=float(loss(params)),
              **_common.fidelity_fields(state))


def summarize(rows):
  groups = {}
  for r in rows:
    groups.setdefault((r['format'], r['rounding'], r['calibrated']),
                      []).append(r)
  return [dict(format=f, rounding=rd, calibrated=c, seeds=len(rs),
               final_loss=statistics.geometric_mean(
                   r['final_loss'] for r in rs),
               **{k: statistics.fmean(r[k] for r in rs)
                  for k in _common.FIDELITY})
          for (f, rd, c), rs in groups.items()]


def render(result):
  meta = result['meta']
  rows = [(f"`{s['format']}`", s['rounding'],
           'yes' if s['calibrated'] else 'no', f"{s['final_loss']:.3g}",
           f"{s['norm_ratio']:.3f}", f"{s['cosine']:.3f}",
           f"{s['weight_distance']:.3f}") for s in result['summary']]
  return '\n'.join([
      '# Block-scale calibration of the first moment',
      '',
      'Written by `examples/scale_calibration.py`; do not edit. AdamW on '
      f"the teacher-student problem, {meta['steps']} steps, seeds "
      f"{meta['seeds']}; the first moment stored in blocks of {BLOCK} "
      '(second moment float32), compared with float32 AdamW on the same '
      'gradients. Loss: geometric mean over seeds; fidelity: means over '
      'seeds of the medians over steps (norm ratio, cosine) and of the '
      'final weight distance.',
      '',
      _common.markdown_table(('first moment', 'rounding', 'calibrated',
                              'final loss', 'norm ratio', 'cosine',
                              'weight distance'), rows),
      '',
      f"- Command: `{meta['command']}`",
      f"- Revision: `{meta['git_revision']}`; date: {meta['date']}; "
      f"{meta['seconds']:.0f} s",
      f"- Machine: {meta['machine']}",
  ]) + '\n'


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0],
                                   formatter_class=_common.HelpFormatter)
  parser.add_argument('--seeds', type=int, nargs='+', default=[0, 1, 2],
                      help='seeds; each runs every configuration')
  parser.add_argument('--steps', type=int, default=1500,
                      help='AdamW steps of each run')
  parser.add_argument('--formats', nargs='+', default=list(FORMATS),
                      help='first-moment formats')
  _common.add_out_argument(parser, __file__)
  args = parser.parse_args(argv)
  t0 = time.perf_counter()
  meta = dict(command=_common.command_line(__file__, argv),
              git_revision=_common.git_revision(), date=_common.now_utc(),
              machine=_common.machine(), seeds=args.seeds, steps=args.steps)
  rows = []
  for fmt in args.formats:
    for rounding in ROUNDINGS:
      for calibrate in (False, True):
        for seed in args.seeds:
          rows.append(run(fmt, rounding, calibrate, seed, args.steps))
        r = summarize(rows)[-1]
        print(f"{fmt} {rounding:10s} calibrated={calibrate!s:5s} loss "
              f"{r['final_loss']:.3g} norm ratio {r['norm_ratio']:.3f} "
              f"cosine {r['cosine']:.3f} weight distance "
              f"{r['weight_distance']:.3f}", flush=True)
  meta['seconds'] = time.perf_counter() - t0
  result = dict(meta=meta, summary=summarize(rows), rows=rows)
  out = pathlib.Path(args.out)
  out.mkdir(parents=True, exist_ok=True)
  (out / 'scale_calibration.json').write_text(
      json.dumps(result, indent=1) + '\n')
  (out / 'scale_calibration.md').write_text(render(result))
  return result


if __name__ == '__main__':
  main()

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
"""Fidelity of low-bit AdamW states to float32 AdamW, across learning rates.

A low-bit state is judged by how closely it follows float32 AdamW run on the
same gradients, not by its loss: every run is wrapped in
``optax_q.track_fidelity`` with ``optax.adamw`` of the same hyperparameters
as its twin, and reports, over the run, the median ratio of its update norm
to the twin's, the median cosine between the two updates, and the final
distance from the twin's weights relative to how far the twin moved.

Three problems, each with AdamW b1 0.9, b2 0.999, eps 1e-8, linear warm-up:

- ``teacher_student``: the low-bit study's regression (tanh MLP
  64-256-256-10 learning a fixed random teacher, full batch of 1024, weight
  decay 0.01, 1e-3 after 100 warm-up steps, 1500 steps); final training
  loss.
- ``digits``: the same MLP shape classifying the 8x8 digits (minibatches
  of 128, weight decay 0.01, 1e-3 after 50 warm-up steps, 500 steps); final
  loss on the whole training split.
- ``lm``: the small GPT (d_model 64, one layer) on the byte-level corpus,
  the precision study's quick mode (3e-3, clipping at 1, 200 steps, one
  seed); validation loss.

Learning-rate sweeps multiply the whole schedule (x0.25 to x8 by default;
x0.5 to x4 for the LM). The window of a state is the range of multipliers,
in octaves, whose loss (geometric mean over seeds) is within 2x of its best,
its edges interpolated log-linearly between the multipliers tried.

``recommended_4bit`` and ``recommended_3bit`` (the keyword arguments of
``optax_q.adamw``): per bit class (quantized moments, scales included:
above 3.3 and at most 4.25; at most 3.3), among the swept states (``SWEPT``:
a window needs a sweep) whose window on the teacher-student problem is at
least 75% of float32's, the one with the highest mean update cosine over
the problems, then the update-norm ratio nearest one.

  python examples/study_fidelity.py                    # runs/study_fidelity/
  python examples/study_fidelity.py --out docs/results # the published page
"""

import argparse
import functools
import json
import math
import pathlib
import statistics
import time

import _common  # pylint: disable=g-bad-import-order
import jax
import jax.numpy as jnp
import numpy as np
import optax
import optax_q
import study_lowbit

from models import data
from models import train as train_lib

# name -> keyword arguments of optax_q.adamw (None: float32 optax.adamw).
CONFIGS = {
    'fp32': None,
    'int8_dynamic': dict(mu_format='int8_dynamic', nu_format='int8_dynamic'),
    'fp8_e4m3': dict(mu_format='fp8_e4m3', nu_format='fp8_e4m3'),
    'nf4 + ue4m0, pow2 scales': dict(mu_format='nf4', nu_format='ue4m0',
                                     scale_mode='block_pow2'),
    'nf4 + ue4m0': dict(mu_format='nf4', nu_format='ue4m0'),
    'nf4 + ue4m0, preconditioner': dict(mu_format='nf4', nu_format='ue4m0',
                                        rounding='preconditioner'),
    'nf4 + int4_mulaw': dict(mu_format='nf4', nu_format='int4_mulaw'),
    'nf4 + int4_mulaw, preconditioner': dict(
        mu_format='nf4', nu_format='int4_mulaw', rounding='preconditioner'),
    'nf4 + int4_mulaw@log': dict(mu_format='nf4',
                                 nu_format='int4_mulaw_unsigned@log'),
    'nf3 + int3_mulaw, pow2 scales': dict(mu_format='nf3',
                                          nu_format='int3_mulaw',
                                          scale_mode='block_pow2'),
    'nf3 + int3_mulaw': dict(mu_format='nf3', nu_format='int3_mulaw'),
    'nf3 + int3_mulaw, preconditioner': dict(
        mu_format='nf3', nu_format='int3_mulaw', rounding='preconditioner'),
    'nf3 + int3_mulaw@sqrt': dict(mu_format='nf3',
                                  nu_format='int3_mulaw_unsigned@sqrt'),
}
# The states swept over learning rates (the others run at x1 only): float32,
# int8, the recommendations of the loss-based study and the candidates.
SWEPT = ('fp32', 'int8_dynamic', 'nf4 + ue4m0, pow2 scales',
         'nf4 + int4_mulaw, preconditioner', 'nf4 + int4_mulaw@log',
         'nf3 + int3_mulaw, pow2 scales', 'nf3 + int3_mulaw, preconditioner',
         'nf3 + int3_mulaw@sqrt')
MULTIPLIERS = {'teacher_student': (0.25, 0.5, 1.0, 2.0, 4.0, 8.0),
               'digits': (0.25, 0.5, 1.0, 2.0, 4.0, 8.0),
               'lm': (0.5, 1.0, 2.0, 4.0)}
SEEDS = {'teacher_student': (0, 1, 2), 'digits': (0, 1, 2), 'lm': (0,)}
BUDGETS = {'recommended_4bit': (3.3, 4.25), 'recommended_3bit': (0.0, 3.3)}
WINDOW_FACTOR = 2.0  # A multiplier is in the window within 2x the best loss.
MIN_WINDOW = 0.75  # Of float32's width, on the teacher-student problem.
# The recommendation rule, written into the results for the pages quoting it.
RULE = dict(window_factor=WINDOW_FACTOR, min_window=MIN_WINDOW,
            budgets=BUDGETS)
LM = _common.RunConfig(d_model=64, num_layers=1, num_heads=4, seq_len=64,
                       batch_size=16, steps=200, learning_rate=3e-3,
                       warmup_steps=20, eval_batches=16)


# ----------------------------------------------------------------------------
# Problems. Each gives ``(params, data, step_loss(params, data, t),
# final_loss(params, data), steps, peak learning rate, warm-up steps)``; the
# data are arguments of the compiled step, so that seeds and multipliers
# share one compilation per problem and state.
# ----------------------------------------------------------------------------


def teacher_student(seed, steps=1500):
  params, x, y = study_lowbit.teacher_student_data(seed)
  return (params, (x, y), lambda p, d, _: study_lowbit.mse(p, *d),
          lambda p, d: study_lowbit.mse(p, *d), steps, 1e-3, 100)


def _cross_entropy(p, x, y):
  return optax.softmax_cross_entropy_with_integer_labels(
      study_lowbit.mlp(p, x), y).mean()


def digits(seed, steps=500):
  split = data.load_digits()
  x, y = jnp.asarray(split.x_train), jnp.asarray(split.y_train)
  params = study_lowbit.init_mlp(jax.random.key(seed))
  rng = np.random.default_rng(seed)
  index = jnp.asarray(np.stack([rng.choice(len(x), 128, replace=False)
                                for _ in range(steps)]))
  return (params, (x, y, index),
          lambda p, d, t: _cross_entropy(p, d[0][d[2][t]], d[1][d[2][t]]),
          lambda p, d: _cross_entropy(p, d[0], d[1]), steps, 1e-3, 50)


def lm(seed, steps=LM.steps):
  corpus = _common.load_corpus(LM)
  model = _common.make_model(LM)
  params = _common.init_params(model, seed)
  batches = data.lm_batches(corpus.train, LM.batch_size, LM.seq_len,
                            seed=seed)
  train_x = jnp.asarray(np.stack([batches(t)[0] for t in range(steps)]))
  train_y = jnp.asarray(np.stack([batches(t)[1] for t in range(steps)]))
  evals = data.lm_eval_batches(corpus.val, LM.batch_size, LM.seq_len,
                               LM.eval_batches)
  eval_x = jnp.asarray(np.stack([b[0] for b in evals]))
  eval_y = jnp.asarray(np.stack([b[1] for b in evals]))
  loss = lambda p, x, y: train_lib.lm_loss(model, p, (x, y))
  return (params, (train_x, train_y, eval_x, eval_y),
          lambda p, d, t: loss(p, d[0][t], d[1][t]),
          lambda p, d: jnp.mean(jax.vmap(lambda x, y: loss(p, x, y))(
              d[2], d[3])),
          steps, LM.learning_rate, LM.warmup_steps)


PROBLEMS = {'teacher_student': teacher_student, 'digits': digits, 'lm': lm}


def make_optimizer(kwargs, problem, peak, warmup, multiplier, seed):
  """AdamW (float32 for ``kwargs=None``); ``multiplier`` and ``seed`` may
  be traced."""
  lr = lambda t: peak * multiplier * jnp.minimum(
      jnp.asarray(t, jnp.float32) / warmup, 1.0)
  common = dict(b1=0.9, b2=0.999, eps=1e-8,
                weight_decay=0.1 if problem == 'lm' else 0.01)
  if kwargs is None:
    tx = optax.adamw(lr, **common)
  else:
    tx = optax_q.adamw(lr, **common, **kwargs, seed=seed)
  if problem == 'lm':
    return optax.chain(optax.clip_by_global_norm(LM.clip_norm), tx)
  return tx


@functools.lru_cache(maxsize=None)
def _compiled(problem, config, steps):
  """The jitted step and final loss of ``problem`` and ``config``."""
  _, _, step_loss, final_loss, n, peak, warmup = PROBLEMS[problem](
      0, **({} if steps is None else {'steps': steps}))

  def tx_of(multiplier, seed):
    args = (problem, peak, warmup, multiplier, seed)
    return optax_q.track_fidelity(make_optimizer(CONFIGS[config], *args),
                                  make_optimizer(None, *args), steps=n)

  @jax.jit
  def step(params, state, d, t, multiplier, seed):
    grads = jax.grad(step_loss)(params, d, t)
    updates, state = tx_of(multiplier, seed).update(grads, state, params)
    return optax.apply_updates(params, updates), state

  return tx_of(1.0, 0).init, step, jax.jit(final_loss)


def run(problem, config, seed, multiplier, steps=None):
  """One run wrapped in track_fidelity: its loss, fidelity and bits."""
  params, d, _, _, n, _, _ = PROBLEMS[problem](
      seed, **({} if steps is None else {'steps': steps}))
  init, step, final_loss = _compiled(problem, config, steps)
  state = init(params)
  m, s = jnp.float32(multiplier), jnp.uint32(seed)
  for t in range(n):
    params, state = step(params, state, d, jnp.int32(t), m, s)
  summary = optax_q.fidelity_summary(state)
  loss = float(final_loss(params, d))
  return dict(
      problem=problem, config=config, seed=seed, multiplier=multiplier,
      loss=loss if math.isfinite(loss) else None,
      **_common.fidelity_fields(state),
      norm_ratio_p10=summary['norm_ratio']['p10'],
      norm_ratio_p90=summary['norm_ratio']['p90'],
      cosine_p10=summary['cosine']['p10'],
      bits=(None if CONFIGS[config] is None else float(
          optax_q.state_bits_per_element(state, quantized_only=True))))


# ----------------------------------------------------------------------------
# Windows, summaries, recommendations.
# ----------------------------------------------------------------------------


def _geomean(xs):
  xs = [x if x is not None else math.inf for x in xs]
  if any(not math.isfinite(x) for x in xs):
    return math.inf
  return math.exp(statistics.fmean(math.log(max(x, 1e-30)) for x in xs))


def window(curve):
  """``(best multiplier, best loss, width in octaves, low, high)`` of a
  ``{multiplier: loss}`` curve: the range whose loss is within
  ``WINDOW_FACTOR`` of the best, edges interpolated in log-log."""
  ms = sorted(curve)
  best = min(ms, key=lambda m: curve[m])
  if not math.isfinite(curve[best]):
    return None  # Diverged at every learning rate: no window.
  limit = WINDOW_FACTOR * curve[best]

  def edge(inner, outer):
    a, b = curve[inner], curve[outer]
    if not math.isfinite(b) or b <= a:
      return math.log2(outer) if b <= limit else math.log2(inner)
    f = (math.log(limit) - math.log(a)) / (math.log(b) - math.log(a))
    return math.log2(inner) + min(1.0, f) * (math.log2(outer)
                                             - math.log2(inner))

  i = ms.index(best)
  lo = i
  while lo > 0 and curve[ms[lo - 1]] <= limit:
    lo -= 1
  hi = i
  while hi < len(ms) - 1 and curve[ms[hi + 1]] <= limit:
    hi += 1
  low = edge(ms[lo], ms[lo - 1]) if lo > 0 else math.log2(ms[0])
  high = edge(ms[hi], ms[hi + 1]) if hi < len(ms) - 1 else math.log2(ms[-1])
  return best, curve[best], high - low, 2**low, 2**high


def summarize(rows):
  """Per problem and state: fidelity at x1, the loss ratio to float32 seed
  by seed, and (where swept) the learning-rate window."""
  out = []
  for problem in PROBLEMS:
    mine = [r for r in rows if r['problem'] == problem]
    if not mine:
      continue
    base = {r['seed']: r['loss'] for r in mine
            if r['config'] == 'fp32' and r['multiplier'] == 1.0}
    fp32_window = None
    for config in CONFIGS:
      at1 = [r for r in mine if r['config'] == config
             and r['multiplier'] == 1.0]
      if not at1:
        continue
      s = dict(problem=problem, config=config, bits=at1[0]['bits'],
               seeds=len(at1))
      for key in ('norm_ratio', 'cosine', 'weight_distance'):
        s[key] = statistics.fmean(r[key] for r in at1)
      ratios = [math.inf if r['loss'] is None else r['loss'] / base[r['seed']]
                for r in at1 if base.get(r['seed'])]
      if ratios:
        s['loss_ratio'] = _geomean(ratios)
        s['loss_ratio_min'], s['loss_ratio_max'] = min(ratios), max(ratios)
      curve = {}
      for m in sorted({r['multiplier'] for r in mine
                       if r['config'] == config}):
        curve[m] = _geomean([r['loss'] for r in mine if r['config'] == config
                             and r['multiplier'] == m])
      found = window(curve) if len(curve) > 1 else None
      if len(curve) > 1:
        s['curve'] = {str(m): v for m, v in curve.items()}
      if found is not None:
        best, best_loss, width, low, high = found
        s.update(best_multiplier=best, best_loss=best_loss,
                 window_octaves=width, window_low=low, window_high=high)
        if config == 'fp32' and width > 0:
          fp32_window = (width, best_loss)
      out.append(s)
    for s in out:
      if s['problem'] == problem and 'window_octaves' in s and fp32_window:
        s['window_vs_fp32'] = s['window_octaves'] / fp32_window[0]
        s['best_vs_fp32'] = s['best_loss'] / fp32_window[1]
  return out


def recommend(summary):
  """Per bit class: the most faithful state whose teacher-student window is
  at least ``MIN_WINDOW`` of float32's (see the module docstring)."""
  by = {}
  for s in summary:
    by.setdefault(s['config'], {})[s['problem']] = s
  problems = {s['problem'] for s in summary}
  finite = lambda x: x is not None and math.isfinite(x)
  rec = {}
  for key, (low, high) in BUDGETS.items():
    fits = []
    for config, per in by.items():
      ts = per.get('teacher_student')
      if (ts is None or set(per) != problems or ts['bits'] is None
          or not low < ts['bits'] <= high
          or not finite(ts.get('window_vs_fp32'))
          or ts['window_vs_fp32'] < MIN_WINDOW
          or not all(finite(p['cosine']) for p in per.values())
          or not finite(ts['norm_ratio']) or ts['norm_ratio'] <= 0
          or not finite(ts.get('loss_ratio'))):
        continue
      cosine = statistics.fmean(p['cosine'] for p in per.values())
      fits.append((cosine, -abs(math.log(ts['norm_ratio'])), config))
    if fits:
      _, _, config = max(fits)
      ts = by[config]['teacher_student']
      kwargs = dict(CONFIGS[config])
      kwargs.setdefault('rounding', 'stochastic')
      rec[key] = dict(
          adamw_kwargs=kwargs, config=config, bits=ts['bits'],
          norm_ratio=ts['norm_ratio'], cosine=ts['cosine'],
          weight_distance=ts['weight_distance'],
          loss_ratio=ts['loss_ratio'],
          window_vs_fp32=ts['window_vs_fp32'],
          best_vs_fp32=ts['best_vs_fp32'],
          mean_cosine=statistics.fmean(p['cosine'] for p in
                                       by[config].values()))
  return rec


# ----------------------------------------------------------------------------
# Output.
# ----------------------------------------------------------------------------


def _plot(path, result):
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use('Agg')
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  problems = [p for p in PROBLEMS
              if any(s['problem'] == p and 'curve' in s
                     for s in result['summary'])]
  fig, axes = plt.subplots(1, max(1, len(problems)),
                           figsize=(4.2 * max(1, len(problems)), 3.6),
                           squeeze=False)
  for ax, problem in zip(axes[0], problems):
    for s in result['summary']:
      if s['problem'] != problem or 'curve' not in s:
        continue
      ms = [float(m) for m in s['curve']]
      ax.plot(ms, list(s['curve'].values()), marker='o', ms=3,
              lw=2.2 if s['config'] == 'fp32' else 1.0,
              color='k' if s['config'] == 'fp32' else None,
              label=s['config'])
    ax.set_xscale('log', base=2)
    ax.set_yscale('log')
    ax.set_xlabel('learning-rate multiplier')
    ax.set_ylabel('final loss (geometric mean over seeds)')
    ax.set_title(problem, fontsize=9)
  axes[0][0].legend(fontsize=6)
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)


def _f(x, spec='.3f'):
  return '-' if x is None or (isinstance(x, float) and not math.isfinite(x)
                              ) else format(x, spec)


def render_markdown(result):
  meta = result['meta']
  rec = '\n'.join(
      f'- `{k}`: `optax_q.adamw(lr, **{v["adamw_kwargs"]})` ({v["config"]}, '
      f'{v["bits"]:.3f} bits): on the teacher-student problem update-norm '
      f'ratio {v["norm_ratio"]:.3f}, cosine {v["cosine"]:.3f}, weight '
      f'distance {v["weight_distance"]:.3f}, final loss {v["loss_ratio"]:.2f}x '
      f'float32\'s; learning-rate window {v["window_vs_fp32"]:.2f}x '
      f'float32\'s, best loss {v["best_vs_fp32"]:.2f}x float32\'s best; mean '
      f'cosine over the problems {v["mean_cosine"]:.3f}'
      for k, v in result['recommended'].items()) or '- none qualifies'
  tables = []
  for problem in PROBLEMS:
    rows = [s for s in result['summary'] if s['problem'] == problem]
    if not rows:
      continue
    body = [(s['config'], _f(s['bits']), _f(s['norm_ratio']),
             _f(s['cosine']), _f(s['weight_distance']),
             _f(s.get('loss_ratio'), '.2f'),
             _f(s.get('best_multiplier'), 'g'),
             _f(s.get('window_octaves'), '.2f'),
             _f(s.get('window_vs_fp32'), '.2f'),
             _f(s.get('best_vs_fp32'), '.2f')) for s in rows]
    tables.append(f'### {problem}\n\n' + _common.markdown_table(
        ('state', 'bits/elem', 'norm ratio', 'cosine', 'weight distance',
         'loss x fp32', 'best lr x', 'window (octaves)', 'window x fp32',
         'best loss x fp32'), body))
  tables = '\n\n'.join(tables)
  return f"""# Fidelity of low-bit AdamW states to float32 AdamW

Written by `examples/study_fidelity.py`; do not edit.

- Command: `{meta['command']}`
- Revision: `{meta['git_revision']}`; date: {meta['date']}
- Machine: {meta['machine']}
- Seeds: {meta['seeds']}; multipliers: {meta['multipliers']}; {meta['seconds']:.0f} s

Every run is wrapped in `optax_q.track_fidelity` beside `optax.adamw` with
the same hyperparameters, fed the same gradients and params. At the default
learning rate (x1): the median over steps of the update-norm ratio (low-bit
over float32) and of the update cosine, the final weight distance from the
float32 twin's weights (relative to how far the twin moved), and the final
loss over float32's (geometric mean over seeds of the seed-by-seed ratio).
Learning-rate sweeps: the multiplier with the lowest loss, the window (the
range of multipliers within {WINDOW_FACTOR:g}x of the state's best loss, in
octaves, edges interpolated), its width and best loss relative to
float32's. A norm ratio above one is a larger effective step than float32
AdamW's; a lower loss than float32 is not more fidelity.

## Recommended

Per bit class (quantized moments, scales included: above 3.3 and at most
4.25; at most 3.3), among the swept states whose teacher-student window is
at least {MIN_WINDOW:.0%} of float32's, the highest mean update cosine over
the problems, then the norm ratio nearest one.

{rec}

![loss against learning-rate multiplier](fidelity.png)

## Results

{tables}
"""


def make_parser():
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0],
                                   formatter_class=_common.HelpFormatter)
  parser.add_argument('--problems', nargs='+', default=list(PROBLEMS),
                      choices=list(PROBLEMS), help='problems to run')
  parser.add_argument('--configs', nargs='+', default=list(CONFIGS),
                      help='states to run (fp32 always runs)')
  parser.add_argument('--seeds', type=int, nargs='+', default=None,
                      help='seeds (default: three, one for the LM)')
  parser.add_argument('--steps', type=int, default=None,
                      help='steps of every run (default: per problem)')
  parser.add_argument('--multipliers', type=float, nargs='+', default=None,
                      help='learning-rate multipliers of the swept states '
                      '(default: per problem)')
  _common.add_out_argument(parser, __file__)
  parser.add_argument('--render', action='store_true',
                      help='only re-write fidelity.{md,png} from the '
                      'fidelity.json in --out')
  return parser


def main(argv=None):
  args = make_parser().parse_args(argv)
  out = pathlib.Path(args.out)
  if args.render:
    result = json.loads((out / 'fidelity.json').read_text())
    result['summary'] = summarize(result['rows'])
    result['recommended'] = recommend(result['summary'])
    result.update(result['recommended'], rule=RULE)
    return _write(out, result)
  unknown = sorted(set(args.configs) - set(CONFIGS))
  if unknown:
    raise SystemExit(f'--configs: unknown {unknown}; known: {list(CONFIGS)}')
  configs = ['fp32'] + [c for c in args.configs if c != 'fp32']
  if args.multipliers and 1.0 not in args.multipliers:
    args.multipliers = sorted(args.multipliers + [1.0])  # x1: fidelity
  t0 = time.perf_counter()
  meta = dict(command=_common.command_line(__file__, argv),
              git_revision=_common.git_revision(), date=_common.now_utc(),
              machine=_common.machine(), steps=args.steps,
              seeds={p: list(args.seeds or SEEDS[p]) for p in args.problems},
              multipliers={p: list(args.multipliers or MULTIPLIERS[p])
                           for p in args.problems})
  rows = []
  for problem in args.problems:
    for config in configs:
      multipliers = (meta['multipliers'][problem] if config in SWEPT
                     else [1.0])
      for multiplier in multipliers:
        for seed in meta['seeds'][problem]:
          t = time.perf_counter()
          row = run(problem, config, seed, multiplier, args.steps)
          row['seconds'] = round(time.perf_counter() - t, 1)
          rows.append(row)
          print(f'{problem:15s} {config:34s} x{multiplier:<5g} seed {seed}: '
                f'loss {_f(row["loss"], ".3e")} ratio '
                f'{row["norm_ratio"]:.3f} cos {row["cosine"]:.3f} '
                f'dist {row["weight_distance"]:.3f} ({row["seconds"]} s)',
                flush=True)
  meta['seconds'] = time.perf_counter() - t0
  summary = summarize(rows)
  result = dict(meta=meta, rule=RULE, recommended=recommend(summary),
                summary=summary, rows=rows)
  result.update(result['recommended'])
  return _write(out, result)


def _finite(x):
  """``x`` with non-finite floats (a diverged run's loss) as None."""
  if isinstance(x, dict):
    return {k: _finite(v) for k, v in x.items()}
  if isinstance(x, (list, tuple)):
    return [_finite(v) for v in x]
  if isinstance(x, float) and not math.isfinite(x):
    return None
  return x


def _write(out, result):
  out.mkdir(parents=True, exist_ok=True)
  result = _finite(result)
  (out / 'fidelity.json').write_text(
      json.dumps(result, indent=1, allow_nan=False) + '\n')
  (out / 'fidelity.md').write_text(render_markdown(result))
  _plot(out / 'fidelity.png', result)
  print(render_markdown(result))
  return result


if __name__ == '__main__':
  main()

"""Adam and Muon under floating-point quantization: the mantissa sweep.

Tang et al. (arXiv 2510.21314) analyse Adam and Muon when gradients (g),
the weights the forward pass sees (w), and the stored first (m) and second
(v) moments are rounded to floating-point formats with M mantissa bits.
Their claims: both keep their full-precision rates if M grows
logarithmically with the number of steps T; Adam is most sensitive to
weights and second moment (beta2 -> 1), Muon needs weaker error control.

This study quantizes one component at a time, then all four, to
``e8m{M}`` (sign and exponent kept, the mantissa rounded stochastically to
M bits, as the paper's simulation) for M in {1, 2, 3, 5, 7, 10}, with
``optax_q.quantized_training``:

* **rosenbrock**: the Rosenbrock function from (-1.2, 1) with noisy
  gradients; metric: final gradient norm;
* **mlp**: an MLP on scikit-learn's digits; metric: final training loss
  on the whole training set;
* **gpt**: the small GPT on the byte-level corpus; metric: final
  validation loss;
* **scaling**: on Rosenbrock, the smallest M whose final gradient norm is
  within a factor of float32's, for T in {500, 2000, 8000} steps;
* **muon8**: 8-bit Muon (``optax_q.muon``: linear int8 momentum, blocks
  of 2048) and 4-bit Muon momentum against float32 Muon on the LM
  benchmark of the other studies (500 steps), with state bits per element.

Seeds change the initial point (and the data order); each configuration
compiles once and trains its seeds together (``jax.vmap`` over a
``lax.scan`` of the steps).

  python examples/study_fp_convergence.py --mode quick      # runs/...
  python examples/study_fp_convergence.py --out docs/results
"""

import argparse
import dataclasses
import functools
import json
import math
import pathlib
import statistics
import time
from typing import Any, Callable

import _common  # pylint: disable=g-bad-import-order
import flax
import jax
import jax.numpy as jnp
import numpy as np
import optax
import optax_q
from models import data
from models import mlp as mlp_lib
from models import train

COMPONENTS = ('g', 'w', 'm', 'v', 'all')
OPTIMIZERS = ('adam', 'muon')
MANTISSAS = (1, 2, 3, 5, 7, 10)
SCALING_MANTISSAS = (1, 2, 3, 4, 5, 6, 7, 8, 10, 12, 14, 16)
# "Within float32": the final metric at most this factor of float32's.
GRAD_NORM_FACTOR = 2.0
LOSS_TOLERANCE = 0.01  # relative, for the losses


@dataclasses.dataclass(frozen=True)
class Mode:
  """Sizes of one study mode."""

  seeds: tuple[int, ...]
  mantissas: tuple[int, ...]
  rosenbrock_steps: int
  mlp_steps: int
  gpt_steps: int
  scaling_steps: tuple[int, ...]
  scaling_mantissas: tuple[int, ...]
  muon8_steps: int
  gpt: dict[str, int]


MODES = {
    'full': Mode(seeds=(0, 1, 2), mantissas=MANTISSAS, rosenbrock_steps=2000,
                 mlp_steps=200, gpt_steps=300,
                 scaling_steps=(500, 2000, 8000),
                 scaling_mantissas=SCALING_MANTISSAS, muon8_steps=500,
                 gpt=dict(d_model=64, num_layers=2, num_heads=4, seq_len=64,
                          batch_size=16)),
    'quick': Mode(seeds=(0, 1), mantissas=(2, 7), rosenbrock_steps=200,
                  mlp_steps=60, gpt_steps=20, scaling_steps=(100, 300),
                  scaling_mantissas=(2, 5, 10), muon8_steps=20,
                  gpt=dict(d_model=32, num_layers=1, num_heads=2, seq_len=32,
                           batch_size=8)),
    # The test suite's: every section, a few steps.
    'smoke': Mode(seeds=(0,), mantissas=(3,), rosenbrock_steps=20,
                  mlp_steps=5, gpt_steps=3, scaling_steps=(10, 20),
                  scaling_mantissas=(3, 10), muon8_steps=4,
                  gpt=dict(d_model=16, num_layers=1, num_heads=2, seq_len=16,
                           batch_size=4)),
}


# ----------------------------------------------------------------------------
# Problems: init(seed) -> params, loss(params, step, seed), metric(params).
# ----------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Problem:
  name: str
  init: Callable[[jax.Array], Any]
  loss: Callable[[Any, jax.Array, jax.Array], jax.Array]
  metric: Callable[[Any], jax.Array]
  metric_name: str
  lr: dict[str, float]
  muon_dims: Callable[[Any], Any] | None = None
  clip_norm: float | None = None


ROSENBROCK_NOISE = 0.01


def _rosenbrock_value(p):
  x, y = p['x'][:, 0], p['x'][:, 1]
  return jnp.sum((1 - x) ** 2 + 100.0 * (y - x ** 2) ** 2)


def rosenbrock() -> Problem:
  """The Rosenbrock function of ``(x, y)``, held as a 1x2 matrix (so Muon
  trains it: its orthogonalized step is the normalized momentum), from
  ``(-1.2, 1)`` plus a seed's offset, with Gaussian gradient noise of
  standard deviation 0.01 (stochastic gradients, as the analysis
  assumes)."""
  def init(seed):
    noise = jax.random.normal(jax.random.key(seed), (1, 2))
    return {'x': jnp.array([[-1.2, 1.0]]) + 0.1 * noise}

  def loss(p, t, seed):
    key = jax.random.fold_in(jax.random.key(seed + 3000), t)
    noise = ROSENBROCK_NOISE * jax.random.normal(key, (1, 2))
    return _rosenbrock_value(p) + jnp.sum(noise * p['x'])

  def metric(p):
    g = jax.grad(_rosenbrock_value)(p)['x']
    return jnp.sqrt(jnp.sum(g * g))

  return Problem('rosenbrock', init, loss, metric, 'final gradient norm',
                 lr=dict(adam=0.3, muon=0.05))


def mlp_digits() -> Problem:
  digits = data.load_digits()
  x, y = jnp.asarray(digits.x_train), jnp.asarray(digits.y_train)
  model = mlp_lib.MLP(features=(128, 128))

  def init(seed):
    return flax.linen.meta.unbox(
        model.init(jax.random.key(seed), x[:1])['params'])

  def loss(p, t, seed):
    key = jax.random.fold_in(jax.random.key(seed + 1000), t)
    idx = jax.random.randint(key, (64,), 0, x.shape[0])
    return train.classification_loss(model, p, (x[idx], y[idx]))

  def metric(p):
    return train.classification_loss(model, p, (x, y))

  # Rates at which neither optimizer has memorized the 1438 training
  # images by the end (training loss near zero hides the differences).
  return Problem('mlp', init, loss, metric, 'final training loss',
                 lr=dict(adam=1e-3, muon=1e-2))


def gpt(sizes: dict[str, int], corpus: data.Corpus) -> Problem:
  cfg = _common.RunConfig(**{k: v for k, v in sizes.items()})
  model = _common.make_model(cfg)
  batch, seq = sizes['batch_size'], sizes['seq_len']
  tokens = jnp.asarray(corpus.train)
  val = data.lm_eval_batches(corpus.val, batch, seq, num_batches=8)
  val_x = jnp.stack([b[0] for b in val])
  val_y = jnp.stack([b[1] for b in val])

  def init(seed):
    return flax.linen.meta.unbox(model.init(
        jax.random.key(seed), jnp.zeros((1, seq), jnp.int32))['params'])

  def loss(p, t, seed):
    key = jax.random.fold_in(jax.random.key(seed + 2000), t)
    starts = jax.random.randint(key, (batch,), 0, tokens.shape[0] - seq - 1)
    window = tokens[starts[:, None] + jnp.arange(seq + 1)].astype(jnp.int32)
    return train.lm_loss(model, p, (window[:, :-1], window[:, 1:]))

  def metric(p):
    losses = jax.vmap(lambda a, b: train.lm_loss(model, p, (a, b)))(
        val_x, val_y)
    return jnp.mean(losses)

  return Problem('gpt', init, loss, metric, 'final validation loss',
                 lr=dict(adam=3e-3, muon=2e-2), muon_dims=_common.gpt_dims,
                 clip_norm=1.0)


# ----------------------------------------------------------------------------
# One configuration: every seed in one compiled program.
# ----------------------------------------------------------------------------


def _schedule(peak: float, steps: int) -> optax.Schedule:
  warmup = max(steps // 20, 1)
  return optax.warmup_cosine_decay_schedule(0.0, peak, warmup, steps, 0.0)


def base_optimizer(problem: Problem, name: str, steps: int):
  """float32 Adam or Muon (its auxiliary Adam at Adam's learning rate),
  after clipping where the problem asks for it."""
  adam_lr = _schedule(problem.lr['adam'], steps)
  if name == 'adam':
    tx = optax.adam(adam_lr)
  else:
    tx = optax.contrib.muon(
        _schedule(problem.lr['muon'], steps), adam_learning_rate=adam_lr,
        muon_weight_dimension_numbers=problem.muon_dims)
  if problem.clip_norm is None:
    return tx
  return optax.chain(optax.clip_by_global_norm(problem.clip_norm), tx)


def formats_of(component: str | None, mantissa: int | None):
  if component is None:
    return {}  # The float32 baseline.
  fmt = f'e8m{mantissa}'
  return fmt if component == 'all' else {component: fmt}


def run_config(problem: Problem, opt: str, component: str | None,
               mantissa: int | None, steps: int, seeds) -> np.ndarray:
  """The final metric of each seed (NaN where the run diverged)."""
  q = optax_q.quantized_training(formats_of(component, mantissa))
  tx = q.optimizer(base_optimizer(problem, opt, steps),
                   elementwise=opt == 'adam')

  def one(seed):
    params = problem.init(seed)
    state = tx.init(params)

    def body(carry, t):
      p, s = carry
      g = jax.grad(lambda p: problem.loss(q.weights(p, t), t, seed))(p)
      u, s = tx.update(g, s, p)
      return (optax.apply_updates(p, u), s), None

    (params, _), _ = jax.lax.scan(body, (params, state), jnp.arange(steps))
    return problem.metric(params)

  out = jax.jit(jax.vmap(one))(jnp.asarray(seeds))
  return np.asarray(out, np.float64)


def sweep(problem: Problem, mode: Mode, steps: int, rows: list) -> None:
  for opt in OPTIMIZERS:
    configs = [(None, None)] + [(c, m) for c in COMPONENTS
                                for m in mode.mantissas]
    for component, mantissa in configs:
      if opt == 'muon' and component == 'v' and problem.name == 'rosenbrock':
        continue  # Muon on one matrix keeps no second moment.
      start = time.time()
      values = run_config(problem, opt, component, mantissa, steps,
                          mode.seeds)
      rows.append(dict(problem=problem.name, optimizer=opt,
                       component=component or 'fp32', mantissa=mantissa,
                       steps=steps, seeds=list(mode.seeds),
                       values=values.tolist(), seconds=time.time() - start))
      print(f'{problem.name:10s} {opt:4s} {component or "fp32":4s} '
            f'M={mantissa!s:4s} {problem.metric_name}: '
            f'{np.mean(values):.4g} ({time.time() - start:.1f} s)',
            flush=True)
    jax.clear_caches()


def scaling(mode: Mode, rows: list) -> None:
  problem = rosenbrock()
  for opt, component in (('adam', 'all'), ('adam', 'v'), ('muon', 'all')):
    for steps in mode.scaling_steps:
      for mantissa in (None,) + mode.scaling_mantissas:
        comp = None if mantissa is None else component
        values = run_config(problem, opt, comp, mantissa, steps, mode.seeds)
        rows.append(dict(problem='scaling', optimizer=opt,
                         component=comp or 'fp32', sweep=component,
                         mantissa=mantissa, steps=steps,
                         seeds=list(mode.seeds), values=values.tolist()))
      print(f'scaling {opt} {component} T={steps} done', flush=True)
      jax.clear_caches()


# ----------------------------------------------------------------------------
# 8-bit Muon on the LM benchmark (the training harness).
# ----------------------------------------------------------------------------

MUON8_CONFIGS = ('muon fp32', 'muon 8-bit', 'muon 4-bit', 'adamw fp32')
MUON_LR = 2e-2


def muon8_optimizer(name: str, cfg, params, seed: int):
  lr = _common.schedule(cfg)
  _, warmup, decay_steps, _ = _common._schedule_args(cfg)  # pylint: disable=protected-access
  muon_lr = optax.warmup_cosine_decay_schedule(
      0.0, MUON_LR, warmup, decay_steps, MUON_LR * cfg.final_lr_fraction)
  if name == 'adamw fp32':
    return _common.make_optimizer(_common.FP32, cfg, seed)
  common = dict(adam_learning_rate=lr, weight_decay=cfg.weight_decay,
                muon_weight_dimension_numbers=_common.gpt_dims(params))
  if name == 'muon fp32':
    tx = optax.contrib.muon(muon_lr, **common)
  elif name == 'muon 8-bit':
    tx = optax_q.muon(muon_lr, seed=seed, **common)
  else:  # 4-bit momentum, blocks of 128; the auxiliary Adam in 8 bits.
    tx = optax_q.muon(muon_lr, mu_format='int4', block_size=128, seed=seed,
                      **common)
  return optax.chain(optax.clip_by_global_norm(cfg.clip_norm), tx)


def muon8(mode: Mode, corpus, rows: list) -> None:
  cfg = _common.RunConfig(steps=mode.muon8_steps)
  if mode.muon8_steps < 100:
    cfg = dataclasses.replace(cfg, d_model=32, num_layers=1, num_heads=2,
                              eval_every=max(mode.muon8_steps // 2, 1),
                              eval_batches=4)
  model = _common.make_model(cfg)
  eval_fn = _common.make_eval_fn(cfg, corpus)
  for name in MUON8_CONFIGS:
    for seed in mode.seeds:
      params = _common.init_params(model, seed)
      tx = muon8_optimizer(name, cfg, params, seed)
      result = train.train(
          model, params, tx,
          data.lm_batches(corpus.train, cfg.batch_size, cfg.seq_len,
                          seed=seed),
          steps=cfg.steps, loss_fn=train.lm_loss, eval_fn=eval_fn,
          eval_every=cfg.eval_every, progress=False, seed=0)
      state = result.opt_state
      times = (result.step_times[1:] if len(result.step_times) > 1
               else result.step_times)
      rows.append(dict(
          problem='muon8', config=name, seed=seed, steps=cfg.steps,
          final_val_loss=float(result.eval_losses[-1]),
          state_bytes=int(optax_q.state_nbytes(state)),
          state_bits_per_element=float(
              optax_q.state_bits_per_element(state)),
          step_ms_median=1e3 * float(np.median(times))))
      print(f'muon8 {name:11s} seed {seed}: '
            f'{rows[-1]["final_val_loss"]:.4f} '
            f'{rows[-1]["state_bits_per_element"]:.2f} bits', flush=True)
    jax.clear_caches()


# ----------------------------------------------------------------------------
# Summary, claims, plots, page.
# ----------------------------------------------------------------------------


def _mean(values):
  finite = [v for v in values if math.isfinite(v)]
  return statistics.fmean(finite) if len(finite) == len(values) else math.nan


def _within(problem: str, value: float, reference: list[float]) -> bool:
  """Whether a mean ``value`` is inside float32's band: a gradient norm at
  most :data:`GRAD_NORM_FACTOR` times float32's mean; a loss at most
  float32's mean plus the larger of :data:`LOSS_TOLERANCE` of it and the
  spread (max - min) of float32's seeds."""
  if not math.isfinite(value):
    return False
  mean = _mean(reference)
  if problem in ('rosenbrock', 'scaling'):
    return value <= GRAD_NORM_FACTOR * mean
  spread = max(reference) - min(reference)
  return value <= mean + max(LOSS_TOLERANCE * mean, spread)


def summarize(rows):
  """Mean per (problem, optimizer, component, M) and its ratio to float32."""
  sweep_rows = [r for r in rows if r['problem'] in ('rosenbrock', 'mlp',
                                                      'gpt')]
  base = {(r['problem'], r['optimizer']): r['values']
          for r in sweep_rows if r['component'] == 'fp32'}
  out = []
  for r in sweep_rows:
    mean = _mean(r['values'])
    ref = base[(r['problem'], r['optimizer'])]
    out.append(dict(problem=r['problem'], optimizer=r['optimizer'],
                    component=r['component'], mantissa=r['mantissa'],
                    mean=mean, std=float(np.std(r['values'])),
                    ratio=mean / _mean(ref) if _mean(ref) else math.nan,
                    within=_within(r['problem'], mean, ref)))
  return out


def _smallest_within(ok: dict[int, bool], mantissas) -> int | None:
  """The smallest M from which every larger swept M is within the band."""
  needed = None
  for m in sorted(mantissas, reverse=True):
    if not ok.get(m, False):
      break
    needed = m
  return needed


def needed_mantissa(summary, problem, opt, component, mantissas):
  """:func:`_smallest_within` for one sweep of the summary."""
  return _smallest_within(
      {s['mantissa']: s['within'] for s in summary
       if (s['problem'], s['optimizer'], s['component']) == (
           problem, opt, component)}, mantissas)


def claims(result):
  """The paper's claims, checked on the measured numbers."""
  summary = result['summary']
  mantissas = result['meta']['mantissas']
  out = {}
  present = {s['problem'] for s in summary}
  for problem in [p for p in ('rosenbrock', 'mlp', 'gpt') if p in present]:
    ranked = {}
    for opt in OPTIMIZERS:
      # Sensitivity: the mean log-ratio to float32 over the swept M.
      score = {}
      for c in ('g', 'w', 'm', 'v'):
        ratios = [s['ratio'] for s in summary if (
            s['problem'], s['optimizer'], s['component']) == (problem, opt,
                                                               c)]
        if ratios:
          score[c] = (statistics.fmean(
              math.log(max(r, 1e-12)) if math.isfinite(r) else 10.0
              for r in ratios))
      ranked[opt] = sorted(score, key=score.get, reverse=True)
    need = {opt: needed_mantissa(summary, problem, opt, 'all', mantissas)
            for opt in OPTIMIZERS}
    adam_top2 = set(ranked['adam'][:2])
    out[problem] = dict(
        adam_sensitivity_order=ranked['adam'],
        muon_sensitivity_order=ranked['muon'],
        adam_most_sensitive_to_v_and_w=adam_top2 == {'v', 'w'},
        needed_mantissa_all=need,
        muon_needs_fewer_bits=(
            need['muon'] is not None and (need['adam'] is None
                                          or need['muon'] < need['adam'])))
  out['scaling'] = scaling_claim(result)
  out['muon8'] = muon8_claim(result)
  return out


def scaling_claim(result):
  rows = [r for r in result['rows'] if r['problem'] == 'scaling']
  if not rows:
    return {}
  out = {}
  for opt, comp in sorted({(r['optimizer'], r['sweep']) for r in rows}):
    per_t = {}
    for steps in sorted({r['steps'] for r in rows}):
      sel = [r for r in rows if (r['optimizer'], r['sweep'], r['steps']) == (
          opt, comp, steps)]
      ref = next(r['values'] for r in sel if r['component'] == 'fp32')
      ok = {r['mantissa']: _within('scaling', _mean(r['values']), ref)
            for r in sel if r['component'] != 'fp32'}
      per_t[steps] = dict(needed_mantissa=_smallest_within(ok, ok),
                          fp32_grad_norm=_mean(ref))
    ts = [t for t, v in per_t.items() if v['needed_mantissa'] is not None]
    slope = None
    if len(ts) >= 2:
      slope = float(np.polyfit(np.log2(ts), [per_t[t]['needed_mantissa']
                                             for t in ts], 1)[0])
    out[f'{opt} {comp}'] = dict(per_steps=per_t,
                                bits_per_doubling_of_T=slope)
  return out


def muon8_claim(result):
  rows = [r for r in result['rows'] if r['problem'] == 'muon8']
  if not rows:
    return {}
  by = {}
  for r in rows:
    by.setdefault(r['config'], []).append(r)
  stats = {}
  for name, rs in by.items():
    losses = [r['final_val_loss'] for r in rs]
    stats[name] = dict(
        mean=_mean(losses), spread=max(losses) - min(losses),
        bits=statistics.fmean(r['state_bits_per_element'] for r in rs),
        step_ms=statistics.fmean(r['step_ms_median'] for r in rs))
  ref = stats['muon fp32']
  for name in ('muon 8-bit', 'muon 4-bit'):
    if name in stats:
      stats[name]['delta'] = stats[name]['mean'] - ref['mean']
      stats[name]['within_fp32_spread'] = (
          abs(stats[name]['delta']) <= ref['spread'])
  return stats


def _plot(path, summary, problem, metric_name, mantissas):
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use('Agg')
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  fig, axes = plt.subplots(1, 2, figsize=(9, 3.4), sharey=True)
  for ax, opt in zip(axes, OPTIMIZERS):
    sel = [s for s in summary if (s['problem'], s['optimizer']) == (
        problem, opt)]
    base = [s['mean'] for s in sel if s['component'] == 'fp32']
    for c in COMPONENTS:
      pts = sorted((s['mantissa'], s['mean']) for s in sel
                   if s['component'] == c and math.isfinite(s['mean']))
      if pts:
        ax.plot(*zip(*pts), marker='o', ms=3, label=c)
    if base:
      ax.axhline(base[0], color='k', lw=0.8, ls='--', label='fp32')
    ax.set_xticks(list(mantissas))
    ax.set_xlabel('mantissa bits M (e8m{M}, stochastic rounding)')
    ax.set_title(f'{problem}: {opt}', fontsize=9)
    if problem == 'rosenbrock':
      ax.set_yscale('log')
  axes[0].set_ylabel(metric_name)
  axes[1].legend(fontsize=7)
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)


def _table(summary, problem, mantissas):
  rows = []
  for opt in OPTIMIZERS:
    sel = {(s['component'], s['mantissa']): s for s in summary
           if (s['problem'], s['optimizer']) == (problem, opt)}
    if not sel:
      continue
    base = sel.get(('fp32', None))
    rows.append((opt, 'fp32', *(['%.4g' % base['mean']] + [''] * (
        len(mantissas) - 1))))
    for c in COMPONENTS:
      cells = []
      for m in mantissas:
        s = sel.get((c, m))
        cells.append('-' if s is None else (
            'diverged' if not math.isfinite(s['mean']) else
            f'{s["mean"]:.4g}' + ('' if s['within'] else ' ✗')))
      if any(x != '-' for x in cells):
        rows.append((opt, c, *cells))
  return _common.markdown_table(
      ('optimizer', 'component', *(f'M={m}' for m in mantissas)), rows)


def _runs_text(meta) -> str:
  runs = meta.get('runs') or [_run_record(meta)]
  return '\n'.join(
      f"- `{r['command']}` (revision `{r['git_revision']}`, {r['date']}, "
      f"{r['seconds']:.0f} s; sections: "
      f"{', '.join(r.get('sections', ['all']))})" for r in runs)


def _claims_text(claims) -> str:
  """The claims as a table per problem, the scaling and 8-bit Muon."""
  def order(x):
    return ' > '.join(x) if x else '-'
  rows = []
  for problem in ('rosenbrock', 'mlp', 'gpt'):
    c = claims.get(problem)
    if c:
      need = c['needed_mantissa_all']
      rows.append((problem, order(c['adam_sensitivity_order']),
                   order(c['muon_sensitivity_order']),
                   'yes' if c['adam_most_sensitive_to_v_and_w'] else 'no',
                   f"{need['adam']} / {need['muon']}",
                   'yes' if c['muon_needs_fewer_bits'] else 'no'))
  text = _common.markdown_table(
      ('problem', 'Adam: most to least sensitive', 'Muon: same',
       'Adam most sensitive to v and w', 'M needed, all (Adam / Muon)',
       'Muon needs fewer bits'), rows)
  scaling_rows = []
  for key, v in claims.get('scaling', {}).items():
    per = v['per_steps']
    scaling_rows.append((key, *(f"{per[t]['needed_mantissa']}"
                                for t in sorted(per, key=int)),
                         '-' if v['bits_per_doubling_of_T'] is None
                         else f"{v['bits_per_doubling_of_T']:.2f}"))
  if scaling_rows:
    steps = sorted(next(iter(claims['scaling'].values()))['per_steps'],
                   key=int)
    text += ('\n\n**Needed M against T** (Rosenbrock; the smallest M from '
             'which every larger swept M is within the band):\n\n'
             + _common.markdown_table(
                 ('optimizer, component', *(f'T={t}' for t in steps),
                  'bits per doubling of T'), scaling_rows))
  muon = claims.get('muon8')
  if muon:
    muon_rows = [(name, f"{v['mean']:.4f}", f"{v['spread']:.4f}",
                  f"{v['bits']:.2f}", f"{v['step_ms']:.1f}",
                  '-' if 'delta' not in v else f"{v['delta']:+.4f}",
                  '-' if 'within_fp32_spread' not in v else
                  ('yes' if v['within_fp32_spread'] else 'no'))
                 for name, v in muon.items()]
    text += ('\n\n**8-bit Muon** (the LM benchmark; validation loss, mean '
             'and spread over seeds; state bits per element from the real '
             'buffers):\n\n' + _common.markdown_table(
                 ('config', 'val loss', 'seed spread', 'state bits',
                  'step ms', 'Δ vs muon fp32', 'within fp32 spread'),
                 muon_rows))
  return text


def render_markdown(result):
  meta = result['meta']
  summary = result['summary']
  mantissas = meta['mantissas']
  sections = []
  for problem, metric in (('rosenbrock', 'final gradient norm'),
                          ('mlp', 'final training loss'),
                          ('gpt', 'final validation loss')):
    if any(s['problem'] == problem for s in summary):
      sections.append(
          f'## {problem}: {metric} (mean of {len(meta["seeds"])} seeds)\n\n'
          f'{_table(summary, problem, mantissas)}\n\n'
          f'![{problem}](fp_convergence_{problem}.png)\n')
  return f"""# Adam and Muon under floating-point quantization

Written by `examples/study_fp_convergence.py`; do not edit.

{_runs_text(meta)}

Machine: {meta['machine']}. Mode {meta['mode']}, seeds {meta['seeds']}.

Each cell quantizes one component (`g` gradients, `w` forward weights, `m`
first moment, `v` second moment) or all four to `e8m{{M}}` with stochastic
rounding. ✗: outside float32's band (a gradient norm more than
{GRAD_NORM_FACTOR:g}x float32's; a loss above float32's mean by more than
{LOSS_TOLERANCE:.0%} or the spread of float32's seeds, whichever is
larger).

{''.join(s + chr(10) for s in sections)}
## Claims

Sensitivity: components ordered by the mean log-ratio of the metric to
float32's over the swept M.

{_claims_text(result['claims'])}
"""


def make_parser():
  p = argparse.ArgumentParser(description=__doc__,
                              formatter_class=_common.HelpFormatter)
  p.add_argument('--mode', choices=tuple(MODES), default='full',
                 help='full: 3 seeds, every mantissa width, thousands of '
                 'steps; quick: 2 seeds, 2 mantissa widths, fewer steps '
                 '(minutes); smoke: a few steps of every section (for the '
                 'tests)')
  p.add_argument('--sections', nargs='+',
                 default=['rosenbrock', 'mlp', 'gpt', 'scaling', 'muon8'],
                 choices=['rosenbrock', 'mlp', 'gpt', 'scaling', 'muon8'],
                 help='parts of the study to run, in this order (see the '
                 'module docstring); with --update, the ones re-run')
  p.add_argument('--render', action='store_true',
                 help='only re-write fp_convergence.{json,md} and the '
                 'plots from the rows of the fp_convergence.json in --out '
                 '(no training)')
  p.add_argument('--update', action='store_true',
                 help='re-run only --sections and replace their rows in '
                 'the JSON in --out (its meta records every run)')
  p.add_argument('--data', default=None, help='a text file to train the '
                 "gpt and muon8 sections on (default: the Python standard "
                 "library's own sources); its first 8,000,000 bytes either "
                 'way')
  _common.add_out_argument(p, __file__)
  return p


def _section(row) -> str:
  return 'muon8' if row['problem'] == 'muon8' else row['problem']


def _run_record(meta):
  """The provenance of one run, from a page's meta."""
  return {k: meta[k] for k in ('command', 'git_revision', 'date', 'machine',
                               'seconds') if k in meta}


def _finish(out: pathlib.Path, result) -> str:
  result['summary'] = summarize(result['rows'])
  result['claims'] = claims(result)
  (out / 'fp_convergence.json').write_text(
      json.dumps(result, indent=1, allow_nan=True) + '\n')
  for problem, metric in (('rosenbrock', 'final gradient norm'),
                          ('mlp', 'final training loss'),
                          ('gpt', 'final validation loss')):
    if any(s['problem'] == problem for s in result['summary']):
      _plot(out / f'fp_convergence_{problem}.png', result['summary'],
            problem, metric, result['meta']['mantissas'])
  md = render_markdown(result)
  (out / 'fp_convergence.md').write_text(md)
  return md


def main(argv=None):
  args = make_parser().parse_args(argv)
  out = pathlib.Path(args.out)
  if args.render:
    return _finish(out, json.loads((out / 'fp_convergence.json').read_text()))
  mode = MODES[args.mode]
  revision = _common.git_revision()
  start = time.time()
  rows, runs = [], []
  if args.update:
    previous = json.loads((out / 'fp_convergence.json').read_text())
    runs = previous['meta'].get('runs') or [_run_record(previous['meta'])]
    rows = [r for r in previous['rows'] if _section(r) not in args.sections]
    if previous['meta']['mode'] != args.mode:
      raise SystemExit(f'--update: the JSON in {out} is mode '
                       f"{previous['meta']['mode']!r}, not {args.mode!r}")
  corpus = None
  if {'gpt', 'muon8'} & set(args.sections):
    corpus = data.load_corpus(args.data)
  out.mkdir(parents=True, exist_ok=True)
  for section in args.sections:
    rows = [r for r in rows if _section(r) != section]
    if section == 'rosenbrock':
      sweep(rosenbrock(), mode, mode.rosenbrock_steps, rows)
    elif section == 'mlp':
      sweep(mlp_digits(), mode, mode.mlp_steps, rows)
    elif section == 'gpt':
      sweep(gpt(mode.gpt, corpus), mode, mode.gpt_steps, rows)
    elif section == 'scaling':
      scaling(mode, rows)
    else:
      muon8(mode, corpus, rows)
    # Written after every section, so a long run keeps what it measured.
    this = dict(command=_common.command_line(__file__, argv),
                git_revision=revision, date=_common.now_utc(),
                machine=_common.machine(), seconds=time.time() - start,
                sections=list(args.sections))
    meta = dict(this, mode=args.mode, seeds=list(mode.seeds),
                mantissas=list(mode.mantissas),
                sizes=dataclasses.asdict(mode), runs=[*runs, this])
    result = dict(meta=meta, rows=rows)
    md = _finish(out, result)
  print(json.dumps(result['claims'], indent=1))
  print(f'wrote {out}/fp_convergence.{{json,md}}')
  return md


if __name__ == '__main__':
  main()

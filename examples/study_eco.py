"""Training without master weights (ECO): final loss against static memory.

The language-model benchmark of the other studies (the small GPT of
:mod:`models.gpt` on the byte-level corpus, AdamW b1 0.9, b2 0.999, eps
1e-8, weight decay 0.1 on matrices, clipping at 1.0, warm-up then cosine),
trained with its weights in a low-precision format:

* **with master weights** (float32 weights; the forward pass sees the
  quantized kernels, the gradient goes straight through):
  ``bf16 w/ MW`` (the reference), ``fp8 w/ MW rn`` and ``fp8 w/ MW sr``;
* **without master weights**: the weights live in their format
  (``optax_q.quantize_params``) and ``optax_q.eco`` updates them: naive
  removal (no feedback) with nearest and stochastic rounding, ECO with
  nearest and stochastic rounding, int4 weights (row scales), bf16 weights
  with stochastic rounding (naive, and with ECO);
* **ECO with low-bit moments** (``optax_q.quantize_state`` around
  ``optax_q.eco``), every matrix in fp8 (embeddings and head included):
  8-bit first moment with 8-bit and 4-bit second moments, and a 4-bit
  first moment, to measure how low the moment carrying the residuals may
  go.

fp8 is ``fp8_e4m3`` with row-wise absmax scales (the paper's). For each:
final validation loss (mean over seeds) and static bytes per parameter:
weights plus optimizer state over all parameters, from the real buffers
(float32 AdamW: 12).

Each run that is not float32 also trains beside its float32 twin (AdamW
with float32 weights and moments, the same schedule, clipping and weight
decay; ``optax_q.track_fidelity``, off with ``--no-fidelity``), fed the
same gradients and the same decoded weights, and the page gives the
fidelity of the update applied to the twin's: for weights without master
copies the step that lands them on their grid.

  python examples/study_eco.py --quick                 # runs/study_eco/
  python examples/study_eco.py --out docs/results      # the published page
  python examples/study_eco.py --out docs/results --add-fidelity --seeds 0
"""

import argparse
import dataclasses
import functools
import json
import pathlib
import shlex
import statistics
import time

import _common  # pylint: disable=g-bad-import-order
import jax
import jax.numpy as jnp
import numpy as np
import optax
import optax_q
from models import data
from models import train

REFERENCE = 'bf16 w/ MW'
FP8 = 'fp8_e4m3'
FIDELITY_HEADER = ('norm ratio', 'cosine', 'weight distance')


@dataclasses.dataclass(frozen=True)
class Config:
  """One row of the study.

  Attributes:
    name: Row label.
    weight_format: The weights' format (None: float32 weights).
    master: Float32 master weights, the forward pass on quantized ones.
    rounding: How weights are rounded.
    variant: ``optax_q.eco``'s ``variant`` (without master weights).
    filter: Which parameters are quantized (``quantize_params``).
    mu: First-moment format (None: float32).
    nu: Second-moment format (None: float32).
    scale_mode: Scale mode of the moments (None: block 128).
    min_size: Moments of leaves with fewer elements stay float32 (None:
      the benchmark's 4096).
    mu_rounding: How the first moment is rounded (the second moment:
      stochastically).
  """

  name: str
  weight_format: str | None
  master: bool = False
  rounding: str = 'stochastic'
  variant: str = 'eco'
  filter: str = 'linear'
  mu: str | None = None
  nu: str | None = None
  scale_mode: str | None = None
  min_size: int | None = None
  mu_rounding: str = 'stochastic'


CONFIGS = (
    Config('fp32', None),
    Config(REFERENCE, 'bf16', master=True, rounding='nearest'),
    Config('fp8 w/ MW rn', FP8, master=True, rounding='nearest'),
    Config('fp8 w/ MW sr', FP8, master=True, rounding='stochastic'),
    Config('fp8 naive rn', FP8, rounding='nearest', variant='naive'),
    Config('fp8 naive sr', FP8, rounding='stochastic', variant='naive'),
    Config('fp8 ECO rn', FP8, rounding='nearest'),
    Config('fp8 ECO sr', FP8, rounding='stochastic'),
    Config('int4 ECO sr', 'int4', rounding='stochastic'),
    Config('bf16 naive sr', 'bf16', rounding='stochastic', variant='naive'),
    Config('bf16 ECO sr', 'bf16', rounding='stochastic'),
    Config('fp8 ECO sr + m8/v8', FP8, filter='matrices', mu='int8_dynamic',
           nu='int8_dynamic'),
    Config('fp8 ECO sr + m8/v4', FP8, filter='matrices', mu='int8_dynamic',
           nu='ue4m0', scale_mode='block_pow2', min_size=0),
    Config('fp8 ECO sr + m4/v4', FP8, filter='matrices', mu='nf4',
           nu='ue4m0', scale_mode='block_pow2', min_size=0),
    # How low the first moment, which carries the residuals, may go.
    Config('fp8 ECO sr + m4 rn/v4', FP8, filter='matrices', mu='nf4',
           nu='ue4m0', scale_mode='block_pow2', min_size=0,
           mu_rounding='nearest'),
    Config('fp8 ECO sr + m3/v4', FP8, filter='matrices', mu='nf3',
           nu='ue4m0', scale_mode='block_pow2', min_size=0),
    Config('fp8 MW + m4/v4', FP8, master=True, rounding='nearest',
           mu='nf4', nu='ue4m0', scale_mode='block_pow2', min_size=0),
)
FP32 = CONFIGS[0]  # The twin of every other configuration.
QUICK = ('fp32', REFERENCE, 'fp8 naive rn', 'fp8 ECO sr',
         'fp8 ECO sr + m8/v4')
TARGET_ECO = 0.5  # percent over the master-weight reference
TARGET_MEMORY = (2.6, 1.0)  # bytes per parameter, percent over reference


def _decay_mask(params):
  return jax.tree.map(lambda p: p.ndim >= 2, params)


@functools.lru_cache(maxsize=64)
def make_optimizer(cfg: Config, run: _common.RunConfig, seed: int):
  """Clipping, then AdamW as ``cfg`` says (cached per seed)."""
  lr = _common.schedule(run)
  common = dict(b1=run.b1, b2=run.b2, eps=run.eps,
                weight_decay=run.weight_decay, mask=_decay_mask)
  clip = optax.clip_by_global_norm(run.clip_norm)
  min_size = run.min_size if cfg.min_size is None else cfg.min_size
  rounding = {'mu': cfg.mu_rounding, 'nu': 'stochastic'}
  if cfg.weight_format is None or cfg.master:
    if cfg.mu or cfg.nu:
      return optax.chain(clip, optax_q.adamw(
          lr, **common, mu_format=cfg.mu or 'fp32',
          nu_format=cfg.nu or 'fp32', rounding=rounding, seed=seed,
          min_size=min_size, block_size=run.block_size,
          scale_mode=cfg.scale_mode))
    return optax.chain(clip, optax.adamw(lr, **common))
  inner = optax.inject_hyperparams(optax.adamw, static_args=('mask',))(
      lr, **common)
  tx = optax_q.eco(inner, cfg.weight_format, rounding=cfg.rounding,
                   variant=cfg.variant, seed=seed)
  if cfg.mu or cfg.nu:
    tx = optax_q.quantize_state(
        tx, {'mu': cfg.mu or 'fp32', 'nu': cfg.nu or 'fp32'},
        rounding=rounding, seed=seed, min_size=min_size,
        block_size=run.block_size, scale_mode=cfg.scale_mode)
  return optax.chain(clip, tx)


@functools.lru_cache(maxsize=64)
def make_tracked_optimizer(cfg: Config, run: _common.RunConfig, seed: int):
  """:func:`make_optimizer`'s transform beside its float32 twin,
  ``make_optimizer(FP32, run, seed)``, for the whole run (cached).

  Master-free runs too: ``track_fidelity`` gives the twin the decoded
  weights and compares it with the step that lands each quantized weight
  on its grid."""
  tx, twin = make_optimizer(cfg, run, seed), make_optimizer(FP32, run, seed)
  # pylint: disable-next=protected-access
  return _common._track_fidelity(tx, twin, run.steps)


@functools.lru_cache(maxsize=64)
def make_loss(cfg: Config):
  """The LM loss; with master weights, on fake-quantized kernels."""
  if not cfg.master:
    return train.lm_loss

  def loss(model, params, batch, rng):
    seed = jax.random.bits(rng, dtype=jnp.uint32)
    params = optax_q.fake_quantize_params(
        params, cfg.weight_format, rounding=cfg.rounding, seed=seed)
    return train.lm_loss(model, params, batch)
  return loss


def nbytes(tree) -> int:
  return optax_q.state_nbytes(tree)


def run_one(cfg: Config, run: _common.RunConfig, corpus, seed: int,
            progress: bool = False, fidelity: bool = False):
  """One row; with ``fidelity``, the fidelity of a run that is not float32
  to its twin (the fp32 row gets 1, 1 and 0 without a twin). Bytes count
  the run's own state, not the twin's; step times include the twin."""
  model = _common.make_model(run)
  params = _common.init_params(model, seed)
  n_params = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(params))
  if cfg.weight_format is not None and not cfg.master:
    params = optax_q.quantize_params(
        params, cfg.weight_format, filter=cfg.filter)
  tracked = fidelity and cfg.weight_format is not None
  tx = (make_tracked_optimizer if tracked else make_optimizer)(cfg, run, seed)
  result = train.train(
      model, params, tx,
      data.lm_batches(corpus.train, run.batch_size, run.seq_len, seed=seed),
      steps=run.steps, loss_fn=make_loss(cfg),
      eval_fn=_common.make_eval_fn(run, corpus), eval_every=run.eval_every,
      progress=progress, desc=cfg.name, seed=seed)
  weight_bytes = nbytes(result.params)
  state_bytes = nbytes(_common.inner_state(result.opt_state))
  times = (result.step_times[1:] if len(result.step_times) > 1
           else result.step_times)
  quantized = optax_q.quantized_leaves(result.params)
  final = float(result.eval_losses[-1])
  row = dict(
      config=cfg.name, seed=seed, final_val_loss=final,
      finite=bool(np.isfinite(final)),
      weight_bytes=weight_bytes, state_bytes=state_bytes,
      params=n_params,
      bytes_per_param=(weight_bytes + state_bytes) / n_params,
      quantized_weight_fraction=sum(q.size for q in quantized.values())
      / n_params,
      step_ms_median=1e3 * float(np.median(times)))
  if tracked:
    row.update(_common.fidelity_fields(result.opt_state))
  elif fidelity:
    row.update(_common.BASELINE_FIDELITY)
  return row


def summarize(rows, configs):
  by, ref_loss = _common.by_config(rows, REFERENCE)
  out = []
  for cfg in configs:
    rs = by.get(cfg.name)
    if not rs:
      continue
    out.append(dict(
        config=cfg.name, weights=cfg.weight_format or 'fp32',
        master=cfg.master or cfg.weight_format is None,
        rounding=cfg.rounding if cfg.weight_format else '-',
        variant=('-' if cfg.master or cfg.weight_format is None
                 else cfg.variant),
        moments=f'{cfg.mu or "fp32"}/{cfg.nu or "fp32"}',
        **_common.loss_fields(rs, ref_loss),
        bytes_per_param=statistics.mean(r['bytes_per_param'] for r in rs),
        quantized_weight_fraction=rs[0]['quantized_weight_fraction'],
        step_ms=statistics.median(r['step_ms_median'] for r in rs),
        **_common.fidelity_means(rs)))
  return out


def pareto(summary):
  """Configurations no other beats on both loss and bytes."""
  ok = [s for s in summary if not s['diverged']]
  return [s['config'] for s in ok if not any(
      (o['mean_loss'] <= s['mean_loss'] and o['bytes_per_param'] <=
       s['bytes_per_param'] and (o['mean_loss'], o['bytes_per_param']) !=
       (s['mean_loss'], s['bytes_per_param'])) for o in ok)]


def targets(summary):
  by = {s['config']: s for s in summary}
  out = {}
  naive = by.get('fp8 naive rn')
  if naive:
    worst = max((s for s in summary if s['config'] != 'fp32'),
                key=lambda s: (s['diverged'], s['mean_loss']))
    out['naive_rn_worst'] = dict(
        met=naive['diverged'] or worst['config'] == 'fp8 naive rn',
        worst=worst['config'])
  eco = by.get('fp8 ECO sr')
  if eco:
    out['eco_sr_within_0.5pct'] = dict(
        met=bool(eco['delta_pct'] <= TARGET_ECO), delta_pct=eco['delta_pct'])
  small = [s for s in summary if s['config'].startswith('fp8 ECO sr +')]
  if small:
    fits = [s for s in small if s['bytes_per_param'] <= TARGET_MEMORY[0]
            and s['delta_pct'] <= TARGET_MEMORY[1]]
    best = min(small, key=lambda s: s['bytes_per_param'])
    out['memory_2.6B_within_1pct'] = dict(
        met=bool(fits), configs=[s['config'] for s in fits],
        smallest=dict(config=best['config'],
                      bytes_per_param=best['bytes_per_param'],
                      delta_pct=best['delta_pct']))
  return out


def _plot(path, summary, front):
  """Loss against bytes per parameter, one marker per configuration.

  Configurations with the same bytes (the weight format decides them) sit
  side by side, a few percent apart, and are named in the legend rather
  than next to their points, where the names would overlap.
  """
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use('Agg')
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  from matplotlib import ticker  # pylint: disable=g-import-not-at-top
  ok = [s for s in summary if not s['diverged']]
  fig, ax = plt.subplots(figsize=(9, 5))
  colors = plt.get_cmap('tab20').colors
  shapes = 'os^Dv<>ph*'
  same = {}
  for s in ok:
    same.setdefault(round(s['bytes_per_param'], 2), []).append(s['config'])
  for i, s in enumerate(ok):
    group = same[round(s['bytes_per_param'], 2)]
    spread = 1.02 ** (group.index(s['config']) - (len(group) - 1) / 2)
    face = colors[i % len(colors)]
    ax.errorbar(s['bytes_per_param'] * spread, s['mean_loss'],
                yerr=s['std_loss'], fmt=shapes[i % len(shapes)], color=face,
                ms=6, capsize=2, lw=1,
                mec='k' if s['config'] in front else face,
                label=s['config'] + (' (Pareto)' if s['config'] in front
                                     else '') + (', master' if s['master']
                                                 else ''))
  pts = sorted((s['bytes_per_param'], s['mean_loss']) for s in ok
               if s['config'] in front)
  if pts:
    ax.plot(*zip(*pts), color='k', lw=0.6, label='Pareto frontier')
  ax.axvline(TARGET_MEMORY[0], color='k', lw=0.5, ls='--',
             label=f'{TARGET_MEMORY[0]} bytes/param')
  ax.set_xscale('log')
  ticks = [t for t in (1.5, 2, 2.6, 3, 4, 5, 6, 8, 10, 12, 16)
           if min(p['bytes_per_param'] for p in ok) / 1.2 <= t
           <= max(p['bytes_per_param'] for p in ok) * 1.2]
  ax.xaxis.set_major_locator(ticker.FixedLocator(ticks))
  ax.xaxis.set_major_formatter(ticker.FormatStrFormatter('%g'))
  ax.xaxis.set_minor_locator(ticker.NullLocator())
  ax.set_xlabel('static bytes per parameter (weights + optimizer state); '
                'equal bytes drawn side by side')
  ax.set_ylabel('final validation loss (nats/byte), mean over seeds')
  ax.set_title('ECO: memory against loss (small GPT)', fontsize=9)
  ax.legend(fontsize=7, loc='center left', bbox_to_anchor=(1.01, 0.5),
            frameon=False)
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)


def _f(x, spec='.4f'):
  return 'diverged' if x != x else format(x, spec)


def _delta(s):
  if s['diverged']:
    return 'diverged'
  return '-' if s['delta_pct'] != s['delta_pct'] else f'{s["delta_pct"]:+.2f}'



def _fidelity_section(result) -> str:
  """The fidelity table and what it says ('' for results without it).

  A table of its own beside the loss: the page's tables stay narrow enough
  for the documentation's column.
  """
  summary = result['summary']
  if not any(s.get(k) is not None for s in summary for k in _common.FIDELITY):
    return ''
  table = _common.markdown_table(
      ('config', 'val loss', *FIDELITY_HEADER),
      [(s['config'], _f(s['mean_loss']),
        *(_common.fidelity_cell(s.get(k)) for k in _common.FIDELITY))
       for s in summary])
  record = result['meta'].get('fidelity')
  source = (_common.fidelity_provenance(record) if record else
            'The step times of the runs with fidelity include the twin\'s '
            '(`--no-fidelity` times them alone).')
  return f"""
Fidelity to float32 AdamW (float32 weights and moments, the same schedule,
clipping and weight decay) fed the same gradients and the same decoded
weights (`optax_q.track_fidelity`), mean over the seeds that have it: the
median over the steps of the ratio of the applied update's norm to the
twin's and of their cosine, and the final distance from the twin's weights
relative to how far the twin moved. Without master weights the applied
update is the step that lands each weight on its grid; with them it is
AdamW's (1, 1, 0 with float32 moments: the forward pass's quantization
shows in the loss, not here); fp32 is its own twin (1, 1, 0). {source}

{table}
"""


def _target_line(key, v) -> str:
  """One target of :func:`targets` as a sentence."""
  verdict = 'met' if v['met'] else 'missed'
  if key == 'naive_rn_worst':
    return (f'fp8 weights rounded to nearest without feedback (`fp8 naive '
            f'rn`) are the worst configuration: {verdict} (the worst is '
            f'`{v["worst"]}`).')
  if key == 'eco_sr_within_0.5pct':
    return (f'`fp8 ECO sr` within +{TARGET_ECO}% of `{REFERENCE}`: '
            f'{verdict} ({v["delta_pct"]:+.2f}%).')
  if key == 'memory_2.6B_within_1pct':
    best = v['smallest']
    fits = ', '.join(f'`{c}`' for c in v['configs']) or 'none'
    return (f'At most {TARGET_MEMORY[0]} bytes per parameter within '
            f'+{TARGET_MEMORY[1]}% of `{REFERENCE}`: {verdict} (by {fits}; '
            f'the smallest, `{best["config"]}`, takes '
            f'{best["bytes_per_param"]:.2f} bytes per parameter at '
            f'{best["delta_pct"]:+.2f}%).')
  raise ValueError(f'unknown target {key!r}')


def render_markdown(result, name='eco'):
  meta, summary = result['meta'], result['summary']
  # Two tables, each narrow enough for the documentation's column: what
  # each configuration stores, then what it measured.
  setup = _common.markdown_table(
      ('config', 'weights', 'master', 'rounding', 'feedback', 'moments'),
      [(s['config'], s['weights'], 'yes' if s['master'] else 'no',
        s['rounding'], s['variant'], s['moments']) for s in summary])
  measured = _common.markdown_table(
      ('config', 'quantized weights', 'bytes/param', 'val loss',
       f'Δ vs {REFERENCE} %', 'step ms'),
      [(s['config'], f'{s["quantized_weight_fraction"]:.2f}',
        f'{s["bytes_per_param"]:.2f}',
        _f(s['mean_loss']) + ('' if s['diverged'] else
                              f' ± {s["std_loss"]:.4f}'),
        _delta(s), f'{s["step_ms"]:.1f}') for s in summary])
  tg = '\n'.join(f'- {_target_line(k, v)}'
                 for k, v in result['targets'].items())
  return f"""# ECO: training without master weights

Written by `examples/study_eco.py`; do not edit.

- Command: `{meta['command']}`
- Revision: `{meta['git_revision']}`; date: {meta['date']}
- Machine: {meta['machine']}
- Seeds: {meta['seeds']}; {meta['steps']} steps; model d_model
  {meta['run_config']['d_model']}, {meta['run_config']['num_layers']} layers;
  {meta['seconds']:.0f} s

What each configuration stores ("master": float32 master weights, the
forward pass on quantized ones; "feedback": the rounding error fed back by
ECO, or dropped, naive):

{setup}

What each measured. Bytes per parameter: weights plus optimizer state over
all parameters, from the real buffers (codes, scales, counters).
"quantized weights": the fraction of parameters stored in the weight
format. Loss: final validation loss, mean ± standard deviation over seeds.

{measured}
{_fidelity_section(result)}
Pareto frontier (no configuration has both a lower loss and fewer bytes):
{', '.join(result['pareto'])}.

## Targets

{tg}

![memory against loss]({name}.png)
"""


def make_parser():
  p = argparse.ArgumentParser(description=__doc__,
                              formatter_class=_common.HelpFormatter)
  p.add_argument('--quick', action='store_true',
                 help='a smoke run: few steps, one seed, five configs')
  p.add_argument('--seeds', type=int, nargs='+', default=None,
                 help='seeds (default: 0 1 2; --quick: 0; --add-fidelity: '
                 'the first published one)')
  p.add_argument('--configs', nargs='+', default=None,
                 help='configuration names (default: all; --add-fidelity: '
                 'the published ones that are not fp32)')
  p.add_argument('--name', default='eco',
                 help='stem of the result files (<name>.json, .md, .png)')
  p.add_argument('--render', action='store_true',
                 help='only re-write <name>.md and .png from the '
                 '<name>.json in --out (no training)')
  _common.add_fidelity_arguments(p)
  _common.add_run_args(p, _common.RunConfig(steps=500))
  _common.add_out_argument(p, __file__)
  return p


def _finish(out, name, result):
  configs = [c for c in CONFIGS
             if c.name in {r['config'] for r in result['rows']}]
  result['summary'] = summarize(result['rows'], configs)
  result['pareto'] = pareto(result['summary'])
  result['targets'] = targets(result['summary'])
  (out / f'{name}.json').write_text(
      json.dumps(result, indent=1, allow_nan=True) + '\n')
  _plot(out / f'{name}.png', result['summary'], result['pareto'])
  md = render_markdown(result, name)
  (out / f'{name}.md').write_text(md)
  return md


def add_fidelity(args, argv, out):
  """Fidelity for a published result, from reruns of some of its runs.

  Reruns the requested seeds of its configurations that are not fp32 with
  the settings recorded in ``<out>/<name>.json`` (its run config and the
  data of its command), each beside its float32 twin, merges their
  fidelity into the published rows (``_common.merge_fidelity``, which
  compares the losses), gives its fp32 rows 1, 1 and 0, and rewrites the
  JSON, page and plot; every other field stays as published.
  """
  path = out / f'{args.name}.json'
  result = json.loads(path.read_text())
  meta = result['meta']
  run = _common.RunConfig(**meta['run_config'])
  recorded = make_parser().parse_args(shlex.split(meta['command'])[2:])
  published = {r['config'] for r in result['rows']}
  names = args.configs or [c.name for c in CONFIGS if c.name in published
                           and c.weight_format is not None]
  seeds = args.seeds or meta['seeds'][:1]
  if set(names) - published or set(seeds) - set(meta['seeds']):
    raise SystemExit(
        f'{path} has configs {sorted(published)} and seeds {meta["seeds"]}; '
        f'asked for {names} and {seeds}')
  corpus = _common.load_corpus(run, recorded.data)
  measured = []
  # fp32 is its own twin: its rows get 1, 1 and 0 below, without a run.
  for cfg in [c for c in CONFIGS
              if c.name in names and c.weight_format is not None]:
    for seed in seeds:
      row = run_one(cfg, run, corpus, seed, fidelity=True)
      measured.append(row)
      print(f'{cfg.name:24s} seed {seed}: loss {row["final_val_loss"]:.4f} '
            f'norm ratio {row["norm_ratio"]:.3f} cosine {row["cosine"]:.3f} '
            f'weight distance {row["weight_distance"]:.3f}', flush=True)
    jax.clear_caches()
  meta['fidelity'] = _common.merge_fidelity(
      result['rows'], measured, command=_common.command_line(__file__, argv),
      seeds=seeds, float32=lambda row: row['config'] == FP32.name,
      previous=meta.get('fidelity'))
  _finish(out, args.name, result)
  record = meta['fidelity']
  print(f'{record["loss_equal"]} of {record["rows"]} reruns reproduced the '
        f'published loss (largest relative difference '
        f'{record["loss_max_relative_difference"]:.1e}); wrote '
        f'{out}/{args.name}.{{json,md,png}}')
  return result


def main(argv=None):
  args = make_parser().parse_args(argv)
  out = pathlib.Path(args.out)
  if args.render:
    result = json.loads((out / f'{args.name}.json').read_text())
    return _finish(out, args.name, result)
  if args.add_fidelity:
    return add_fidelity(args, argv, out)
  seeds = args.seeds or ([0] if args.quick else [0, 1, 2])
  run = _common.run_config_from_args(args)
  if args.quick and run.steps == 500:
    run = dataclasses.replace(run, steps=40, eval_batches=8)
  if run.eval_every == 100:
    run = dataclasses.replace(run, eval_every=max(run.steps // 5, 1))
  names = args.configs or (QUICK if args.quick else
                           [c.name for c in CONFIGS])
  unknown = set(names) - {c.name for c in CONFIGS}
  if unknown:
    raise SystemExit(f'unknown configs {sorted(unknown)}; known: '
                     f'{[c.name for c in CONFIGS]}')
  configs = [c for c in CONFIGS if c.name in names]
  corpus = _common.load_corpus(run, args.data)
  # The revision the runs start from (edits made while they run are not
  # loaded by this process).
  revision = _common.git_revision()
  start = time.time()
  rows = []
  for cfg in configs:
    for seed in seeds:
      row = run_one(cfg, run, corpus, seed, fidelity=args.fidelity)
      rows.append(row)
      fid = (f'cosine {row["cosine"]:.3f} ' if args.fidelity else '')
      print(f'{cfg.name:24s} seed {seed}: loss {row["final_val_loss"]:.4f} '
            f'{fid}{row["bytes_per_param"]:.2f} B/param '
            f'{row["step_ms_median"]:.1f} ms/step', flush=True)
    jax.clear_caches()
  meta = dict(command=_common.command_line(__file__, argv),
              git_revision=revision, date=_common.now_utc(),
              machine=_common.machine(), seeds=seeds, steps=run.steps,
              run_config=dataclasses.asdict(run),
              seconds=time.time() - start)
  result = dict(meta=meta, rows=rows)
  out.mkdir(parents=True, exist_ok=True)
  _finish(out, args.name, result)
  summary = result['summary']
  print(_common.text_table(
      ('config', 'B/param', 'loss', 'delta %'),
      [(s['config'], f'{s["bytes_per_param"]:.2f}', _f(s['mean_loss']),
        _delta(s)) for s in summary]))
  print(f'wrote {out}/{args.name}.{{json,md,png}}')
  return result


if __name__ == '__main__':
  main()

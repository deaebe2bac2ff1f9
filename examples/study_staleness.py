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
r"""The staleness ablation: rounding and resets on the small GPT.

Table 5 of Topollai & Choromanska (arXiv 2603.16731) at toy scale: AdamW
whose two moments are stored in fp8 e4m3 or 4 bits (fp4 e2m1 first moment,
zero-free e2m2 second moment), with

* ``nearest``: round-to-nearest only,
* ``stochastic``: stochastic rounding only,
* ``nearest+resets``: round-to-nearest with periodic resets of both moments,
* ``stochastic+resets``: both,

against fp32 moments (``optax.adamw``), for several seeds. The reset period
is the stall model's ``K*`` (:func:`optax_q.reset_period`) for the second
moment's format at the run's ``b2``. The model, data, schedule and clipping
are those of ``examples/_common.py`` (the precision study).

The quick mode (the default) is scaled down in time: ``b2 = 0.99`` instead
of 0.999, so that its 600 steps span six EMA time constants and several
reset periods (``K*`` = 97 for fp8 and 72 for 4-bit at 0.99), as the
paper's 10K-20K step runs do at 0.999. ``--mode paper`` keeps 0.999 (longer).

Writes ``<name>.json``, ``<name>.md`` and ``<name>.png`` (the paired gap
to fp32 and the stalled fraction per row; ``staleness`` unless ``--name``
says otherwise) to ``--out``, by default ``runs/study_staleness/`` in the
repository (git-ignored). ``--render`` re-writes the page and the plot from
the saved JSON without training. The published results are written only
when asked for, with ``--out docs/results``::

  python examples/study_staleness.py     # quick, ~30 min, 2 shared cores
  python examples/study_staleness.py --mode paper   # b2 = 0.999, 3000 steps
  python examples/study_staleness.py --out docs/results   # the published table
  python examples/study_staleness.py --render --name staleness_paper \
      --out docs/results                # page and plot from the JSON
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import pathlib
import statistics
import time

import jax
import jax.numpy as jnp
import optax

import _common  # pylint: disable=g-bad-import-order

from models import data  # pylint: disable=g-bad-import-order
from models import sharding  # pylint: disable=g-bad-import-order
from models import train  # pylint: disable=g-bad-import-order

optax_q = _common.optax_q

FORMATS = {'fp8': ('fp8_e4m3', 'fp8_e4m3'), '4bit': ('fp4_e2m1', 'fp4_e2m2u')}
VARIANTS = (('nearest', False), ('stochastic', False), ('nearest', True),
            ('stochastic', True))

MODES = {
    'quick': _common.RunConfig(
        d_model=64, num_layers=2, num_heads=4, seq_len=64, batch_size=16,
        steps=600, learning_rate=3e-3, warmup_steps=60, eval_every=100,
        eval_batches=16, b2=0.99),
    'paper': _common.RunConfig(
        d_model=64, num_layers=2, num_heads=4, seq_len=64, batch_size=16,
        steps=3000, learning_rate=3e-3, warmup_steps=300, eval_every=500,
        eval_batches=16, b2=0.999),
}


def _decay_mask(params):
  return jax.tree.map(lambda p: p.ndim >= 2, params)


def make_optimizer(fmt, rounding, resets, cfg, seed, fields=('mu', 'nu'),
                   reset_every=None):
  """The chain for one row; ``reset_every`` overrides ``K*``."""
  lr = _common.schedule(cfg)
  common = dict(b1=cfg.b1, b2=cfg.b2, eps=cfg.eps,
                weight_decay=cfg.weight_decay, mask=_decay_mask)
  if fmt == 'fp32' and not resets:
    adamw = optax.adamw(lr, **common)
    period = None
  elif fmt == 'fp32':
    # Float32 moments with resets (Table 5's FP32 column): the reset
    # machinery around unquantized state.
    period = reset_every or 1000
    adamw = optax_q.adamw(
        lr, **common, mu_format='fp32', nu_format='fp32',
        reset_every={f: period for f in fields})
  else:
    mu, nu = FORMATS[fmt]
    period = None
    if resets:
      period = reset_every or optax_q.reset_period(nu, b2=cfg.b2)
    adamw = optax_q.adamw(
        lr, **common, mu_format=mu, nu_format=nu, rounding=rounding,
        block_size=cfg.block_size, seed=seed, min_size=cfg.min_size,
        reset_every=None if period is None else {f: period for f in fields},
        track_stalls=True)
  return optax.chain(optax.clip_by_global_norm(cfg.clip_norm), adamw), period


def _nu_stall(state):
  vals = [float(v) for k, v in optax_q.stall_fraction(state).items()
          if '/nu/' in k]
  return statistics.fmean(vals) if vals else float('nan')


def _reset_tag(resets, fields):
  if not resets:
    return ''
  return '+resets' if set(fields) == {'mu', 'nu'} else (
      f"+resets({','.join(fields)})")


def run_one(fmt, rounding, resets, cfg, corpus, model, eval_fn, seed,
            fields=('mu', 'nu'), reset_every=None, tag_period=False):
  tx, period = make_optimizer(fmt, rounding, resets, cfg, seed, fields,
                              reset_every)
  params = sharding.init_params(
      model, jnp.zeros((1, cfg.seq_len), jnp.int32), seed=seed)
  if fmt == 'fp32':
    name = 'fp32' + _reset_tag(resets, fields)
  else:
    name = f'{fmt}/{rounding}' + _reset_tag(resets, fields)
  if resets and tag_period:
    name += f'@{period}'
  result = train.train(
      model, params, tx,
      data.lm_batches(corpus.train, cfg.batch_size, cfg.seq_len, seed=seed),
      steps=cfg.steps, loss_fn=train.lm_loss, eval_fn=eval_fn,
      eval_every=cfg.eval_every, progress=True, desc=f'{name} s{seed}',
      seed=0)
  state = result.opt_state
  n_resets = None
  for node in jax.tree.leaves(
      state, is_leaf=lambda x: isinstance(x, optax_q.ResetState)):
    if isinstance(node, optax_q.ResetState):
      n_resets = max(int(v) for v in node.resets.values())
  return dict(
      config=name, format=fmt, rounding=rounding or '-',
      resets=bool(resets), reset_period=period, seed=seed,
      final_val_loss=float(result.eval_losses[-1]),
      final_train_loss=float(result.final_loss),
      nu_stalled_last_step=None if fmt == 'fp32' else _nu_stall(state),
      resets_done=n_resets,
      state_bytes=int(optax_q.state_nbytes(state)))


def summarize(rows):
  by = {}
  for r in rows:
    by.setdefault(r['config'], []).append(r)
  base = {r['seed']: r['final_val_loss'] for r in by.get('fp32', [])}
  out = []
  for name, rs in by.items():
    losses = [r['final_val_loss'] for r in rs]
    gaps = [r['final_val_loss'] - base[r['seed']] for r in rs
            if r['seed'] in base]
    stalls = [r['nu_stalled_last_step'] for r in rs
              if r['nu_stalled_last_step'] is not None]
    out.append(dict(
        config=name, seeds=len(rs), mean_val_loss=statistics.fmean(losses),
        std_val_loss=statistics.stdev(losses) if len(rs) > 1 else 0.0,
        mean_gap_to_fp32=statistics.fmean(gaps) if gaps else None,
        std_gap=statistics.stdev(gaps) if len(gaps) > 1 else 0.0,
        nu_stalled_last_step=statistics.fmean(stalls) if stalls else None,
        reset_period=rs[0]['reset_period'], resets_done=rs[0]['resets_done'],
        state_bytes=rs[0]['state_bytes']))
  return out


def make_parser() -> argparse.ArgumentParser:
  """The flags of :func:`main`."""
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0],
                                   formatter_class=_common.HelpFormatter)
  parser.add_argument('--mode', choices=sorted(MODES), default='quick',
                      help="quick: a small GPT, minutes; paper: the paper's "
                      'setting scaled to CPU')
  parser.add_argument('--seeds', type=int, nargs='+', default=[0, 1, 2],
                      help='seeds; each runs every variant')
  parser.add_argument('--formats', nargs='+', default=sorted(FORMATS),
                      choices=sorted(FORMATS), help='state formats compared')
  parser.add_argument('--steps', type=int, default=None,
                      help="training steps (default: the mode's)")
  parser.add_argument('--eps', type=float, default=None,
                      help="Adam's eps (default 1e-8)")
  parser.add_argument(
      '--variants', nargs='+', default=None,
      choices=['nearest', 'stochastic', 'nearest+resets',
               'stochastic+resets'],
      help='rounding of the low-precision rows, with or without resets of '
      'the moments (default: all four)')
  parser.add_argument('--reset-fields', nargs='+', default=['mu', 'nu'],
                      choices=['mu', 'nu'],
                      help='moments that are reset (default both)')
  parser.add_argument('--reset-every', type=int, nargs='+', default=None,
                      help='reset period(s) of the reset rows (default: K* '
                      'of the second moment\'s format; 1000 for fp32); '
                      'several periods make one row per period (a sweep)')
  parser.add_argument('--fp32-resets', action='store_true',
                      help='add a float32 row with resets (Table 5, FP32 '
                      'column)')
  parser.add_argument('--merge', nargs='+', default=None, metavar='JSON',
                      help='no training: pool the rows of earlier runs of '
                      'one mode into <name>.json/.md (reset rows are named '
                      'with their period; a repeated config and seed is '
                      'taken from the first file)')
  parser.add_argument('--render', action='store_true',
                      help='no training: re-write <name>.md and <name>.png '
                      'from the <name>.json in --out')
  parser.add_argument('--name', default='staleness',
                      help='output stem: <out>/<name>.json, .md and .png')
  _common.add_out_argument(parser, __file__)
  return parser


def main(argv=None):
  parser = make_parser()
  args = parser.parse_args(argv)
  if args.reset_every is not None and min(args.reset_every) < 1:
    parser.error('--reset-every must be positive integers')
  periods = args.reset_every or [None]
  sweep = len(periods) > 1
  if args.merge:
    merge(args.merge, pathlib.Path(args.out), args.name, argv)
    return
  if args.render:
    render(pathlib.Path(args.out), args.name)
    return
  cfg = MODES[args.mode]
  if args.steps:
    cfg = dataclasses.replace(cfg, steps=args.steps)
  if args.eps is not None:
    cfg = dataclasses.replace(cfg, eps=args.eps)
  out_dir = pathlib.Path(args.out)
  out_dir.mkdir(parents=True, exist_ok=True)
  meta = dict(command=_common.command_line(__file__, argv),
              git_revision=_common.git_revision(), date=_common.now_utc(),
              machine=_common.machine(), load_average=_common.load_average(),
              mode=args.mode, run_config=dataclasses.asdict(cfg),
              seeds=args.seeds)
  t0 = time.time()
  corpus = _common.load_corpus(cfg)
  model = _common.make_model(cfg)
  eval_fn = train.make_eval_fn(_common.eval_batches(cfg, corpus))
  variants = [(r, z) for r, z in VARIANTS if args.variants is None
              or (r + ('+resets' if z else '')) in args.variants]
  jobs = [('fp32', None, False, None)] + [
      ('fp32', None, True, k) for k in periods if args.fp32_resets] + [
          (f, r, z, k) for f in args.formats for r, z in variants
          for k in (periods if z else [None])]
  meta['reset_fields'] = args.reset_fields
  meta['reset_every'] = args.reset_every
  rows = []
  for seed in args.seeds:
    for fmt, rounding, resets, period in jobs:
      row = run_one(fmt, rounding, resets, cfg, corpus, model, eval_fn, seed,
                    tuple(args.reset_fields), period, sweep)
      rows.append(row)
      print(json.dumps(row), flush=True)
  meta['seconds'] = round(time.time() - t0, 1)
  summary = summarize(rows)
  with open(out_dir / f'{args.name}.json', 'w') as f:
    json.dump(dict(meta=meta, summary=summary, rows=rows), f, indent=1)
  write_outputs(out_dir, args.name, meta, summary, cfg)
  print(_common.markdown_table(*_table(summary)))


def render(out_dir, name):
  """``<name>.md`` and ``<name>.png`` from ``<name>.json``."""
  data = json.loads((out_dir / f'{name}.json').read_text())
  meta = data['meta']
  write_outputs(out_dir, name, meta, data['summary'],
                _common.RunConfig(**meta['run_config']))
  print(f'wrote {out_dir}/{name}.{{md,png}}')


_FORMAT_ORDER = {'fp32': 0, 'fp8': 1, '4bit': 2}


def _row_order(row):
  return (_FORMAT_ORDER.get(row['format'], 9), row['resets'],
          row['reset_period'] or 0, row['rounding'], row['config'])


def merge(paths, out_dir, name, argv=None):
  """Pools the rows of several result files into one table.

  The runs must share their run configuration (model, schedule, ``b2``,
  steps) and reset fields; rows are paired with the fp32 row of the same
  seed, as in a single run.
  """
  rows, seen, sources = [], set(), []
  cfg = fields = mode = None
  for path in paths:
    data = json.loads(pathlib.Path(path).read_text())
    meta = data['meta']
    if cfg is None:
      cfg, fields, mode = (meta['run_config'], meta.get('reset_fields'),
                           meta['mode'])
    elif meta['run_config'] != cfg or meta.get('reset_fields') != fields:
      raise ValueError(f'{path}: run configuration or reset fields differ '
                       f'from {paths[0]}; only runs of one setting pool')
    sources.append(dict(file=pathlib.Path(path).name,
                        command=meta['command'],
                        git_revision=meta['git_revision'], date=meta['date'],
                        seeds=meta['seeds'], seconds=meta['seconds']))
    for row in data['rows']:
      row = dict(row)
      if row['resets'] and '@' not in row['config']:
        row['config'] += f"@{row['reset_period']}"
      if (row['config'], row['seed']) not in seen:
        seen.add((row['config'], row['seed']))
        rows.append(row)
  rows.sort(key=_row_order)
  meta = dict(command=_common.command_line(__file__, argv),
              git_revision=_common.git_revision(), date=_common.now_utc(),
              machine=None, load_average=None,
              mode=mode,
              run_config=cfg, reset_fields=fields, reset_every=None,
              seeds=sorted({r['seed'] for r in rows}),
              seconds=round(sum(s['seconds'] for s in sources), 1),
              sources=sources)
  summary = summarize(rows)
  out_dir.mkdir(parents=True, exist_ok=True)
  with open(out_dir / f'{name}.json', 'w') as f:
    json.dump(dict(meta=meta, summary=summary, rows=rows), f, indent=1)
  write_outputs(out_dir, name, meta, summary, _common.RunConfig(**cfg))
  print(_common.markdown_table(*_table(summary)))


def _fmt(x, spec):
  return '-' if x is None else format(x, spec)


def _table(summary):
  header = ('config', 'reset period', 'resets', 'seeds',
            'val loss (mean +- sd)', 'gap to fp32 (paired)',
            'nu stalled (last step)')
  rows = [(s['config'], _fmt(s['reset_period'], 'd'),
           _fmt(s['resets_done'], 'd'), s['seeds'],
           f"{s['mean_val_loss']:.4f} +- {s['std_val_loss']:.4f}",
           '-' if s['config'] == 'fp32' else
           f"{s['mean_gap_to_fp32']:+.4f} +- {s['std_gap']:.4f}",
           _fmt(s['nu_stalled_last_step'], '.3f')) for s in summary]
  return header, rows


def _period_text(meta):
  if meta.get('sources'):
    return "`N` steps, the `@N` in the row's name"
  if meta.get('reset_every'):
    periods = meta['reset_every']
    if isinstance(periods, int):  # Written by versions with one period.
      periods = [periods]
    return (', '.join(map(str, periods)) +
            ' steps (`--reset-every`)')
  return '`K* = reset_period(nu_format, b2)` steps (1000 for fp32)'


def _provenance(meta):
  if not meta.get('sources'):
    return f"""- Command: `{meta['command']}`
- Git revision: `{meta['git_revision']}`
- Date: {meta['date']}
- Machine: {meta['machine']} (load average {meta['load_average']} at start;
  shared with other jobs, so no timings are reported)"""
  lines = [f"- Pooled by: `{meta['command']}` (no training)"]
  lines += [f"- From `{s['file']}`: `{s['command']}` (revision "
            f"`{s['git_revision']}`, {s['date']}, seeds {s['seeds']})"
            for s in meta['sources']]
  return '\n'.join(lines)


_FORMAT_COLORS = {'fp32': '0.4', 'fp8': 'C0', '4bit': 'C1'}


def plot(path, meta, summary, cfg):
  """Per row: the gap to fp32 paired by seed (mean +- sd; band: fp32's seed
  sd) and the second moment's stalled fraction in the last step."""
  from matplotlib.figure import Figure  # pylint: disable=g-import-not-at-top
  fig = Figure(figsize=(10, 0.36 * len(summary) + 1.9), layout='constrained')
  ax_gap, ax_stall = fig.subplots(1, 2, sharey=True,
                                  gridspec_kw=dict(width_ratios=(3, 2)))
  base = next((s for s in summary if s['config'] == 'fp32'), None)
  if base is not None:
    ax_gap.axvspan(-base['std_val_loss'], base['std_val_loss'], color='0.88',
                   lw=0, label='fp32 seed sd')
  ax_gap.axvline(0.0, color='0.3', lw=0.8)
  for j, s in enumerate(summary):
    fmt = s['config'].split('/')[0].split('+')[0]
    color = _FORMAT_COLORS.get(fmt, 'C2')
    resets = s['reset_period'] is not None
    style = dict(color=color, ms=6, capsize=3,
                 mfc=color if resets else 'white')
    if s['config'] == 'fp32':
      ax_gap.text(0.0, j, f"  the reference: val loss {s['mean_val_loss']:.4f}"
                  f" +- {s['std_val_loss']:.4f}", va='center', fontsize=7)
    elif s['mean_gap_to_fp32'] is not None:
      ax_gap.errorbar(s['mean_gap_to_fp32'], j, xerr=s['std_gap'],
                      fmt='o' if resets else 's', **style)
    if s['nu_stalled_last_step'] is not None:
      ax_stall.barh(j, s['nu_stalled_last_step'], color=color,
                    alpha=1.0 if resets else 0.5)
  ax_gap.set_yticks(range(len(summary)))
  ax_gap.set_yticklabels([s['config'] for s in summary], fontsize=8)
  ax_gap.set_ylim(len(summary) - 0.5, -0.5)
  ax_gap.set_xlabel('final validation loss - fp32, same seed (mean +- sd '
                    'over seeds)', fontsize=8)
  ax_gap.legend(fontsize=7, loc='best')
  ax_stall.set_xlim(0, 1)
  ax_stall.set_xlabel('nu stalled in the last step (fraction)', fontsize=8)
  for ax in (ax_gap, ax_stall):
    ax.grid(axis='x', alpha=0.3)
    ax.tick_params(axis='x', labelsize=7)
  fig.suptitle(
      f"Staleness ablation ({path.stem}), {meta['mode']} mode: "
      f"{cfg.steps} steps, b2 {cfg.b2}, seeds {meta['seeds']}; filled: "
      f"with resets of {' and '.join(meta.get('reset_fields', ['mu', 'nu']))}",
      fontsize=9)
  fig.savefig(path, dpi=110)
  return path


def write_outputs(out_dir, name, meta, summary, cfg):
  """``<name>.md`` and ``<name>.png`` in ``out_dir``."""
  write_markdown(out_dir / f'{name}.md', meta, summary, cfg)
  plot(out_dir / f'{name}.png', meta, summary, cfg)


def write_markdown(path, meta, summary, cfg):
  header, rows = _table(summary)
  text = f"""# Staleness ablation on the small GPT

Generated by `examples/study_staleness.py`; do not edit by hand.

{_provenance(meta)}
- Mode: {meta['mode']}: GPT d_model {cfg.d_model}, {cfg.num_layers} layers,
  seq {cfg.seq_len}, batch {cfg.batch_size}, {cfg.steps} steps, b1 {cfg.b1},
  b2 {cfg.b2}, eps {cfg.eps}, lr {cfg.learning_rate} (warm-up {cfg.warmup_steps}, cosine),
  clip {cfg.clip_norm}, weight decay {cfg.weight_decay}; seeds
  {meta['seeds']}; {meta['seconds']} s in all.

Resets zero {' and '.join(meta.get('reset_fields', ['mu', 'nu']))} every
{_period_text(meta)} (bias correction by local age). "nu stalled" is the stalled fraction of the
second-moment leaves in the last step (`optax_q.stall_fraction`, averaged
over leaves). The gap is paired by seed (same init, data order and rounding
seed as the fp32 run).

![gap to fp32 and stalled fraction per row]({path.stem}.png)

{_common.markdown_table(header, rows)}
"""
  path.write_text(text)


if __name__ == '__main__':
  main()

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
"""AdamW, Shampoo and SOAP with float32, bf16, fp8, 8-bit and 4-bit state.

The LM benchmark of the other studies (a GPT of d_model 128 and 2 layers on
the byte-level corpus; warm-up and cosine schedule, clipping, weight decay
0.1), trained with:

* **adamw fp32**: ``optax.adamw``, the baseline;
* **shampoo** / **soap**, each with every statistic (moments, factor
  statistics, eigenbases) in ``fp32``, in ``bf16`` and in ``fp8_e4m3``
  (block scales; rounded to nearest), without and with resets (moments to
  zero, factor statistics to a scaled identity, every
  ``reset_period(fp8_e4m3, b2=0.999)`` steps: the staleness paper's
  Table 7 ablation); with the constructors' 8-bit defaults (``int8_dynamic``
  moments, ``int8`` statistics with one scale per row and ``int8``
  eigenbases; stochastic rounding); and with a 4-bit preconditioner
  (``int4`` statistics and eigenbases, 8-bit moments).

Each row: the final validation loss (3 seeds), state bytes per parameter
(from the real buffers), and the median step time (refresh steps
included; taken with the machine shared, so only indicative: the step-time
target is measured by ``examples/bench_step.py --second-order``).

Each low-bit run trains beside its float32 twin, the same optimizer with
every state in ``fp32`` (``shampoo fp32`` or ``soap fp32``), fed the same
gradients and params (``optax_q.track_fidelity``; off with
``--no-fidelity``), and its row gives the median update-norm ratio and
cosine to the twin and the final relative weight distance. The twin does
not change the run (its updates are the optimizer's, bit for bit), so
``--add-fidelity --seeds 0`` reruns seed 0 of a published result beside
the twins and adds their fidelity to it.

Modes: ``full`` (500 steps, 3 seeds), ``quick`` (150 steps, 3 seeds) and
``smoke`` (a few steps of a tiny model, for the tests).

Usage::

  python examples/study_second_order.py                  # runs/...
  python examples/study_second_order.py --mode quick
  python examples/study_second_order.py --out docs/results
  python examples/study_second_order.py --out docs/results \
      --add-fidelity --seeds 0
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import pathlib
import shlex
import statistics
import time
from typing import Any

import _common  # pylint: disable=g-bad-import-order
import jax
import numpy as np
import optax
import optax_q
from models import data
from models import train

LEARNING_RATE = 3e-3
B2 = 0.999  # Adam's and the factor statistics' decay (the paper's SOAP).
MAX_DIM = 128
SHAMPOO_FREQUENCY = 20  # The optimizer study's DistributedShampoo setting.
SOAP_FREQUENCY = 10  # The staleness paper's SOAP setting.
RESET_EVERY = optax_q.reset_period('fp8_e4m3', b2=B2)
FP8 = 'fp8_e4m3'

# name -> (optimizer, formats, rounding, resets)
CONFIGS = {'adamw fp32': ('adamw', None, None, False)}
for _opt in ('shampoo', 'soap'):
  CONFIGS.update({
      f'{_opt} fp32': (_opt, 'fp32', 'nearest', False),
      f'{_opt} bf16': (_opt, 'bf16', 'nearest', False),
      f'{_opt} bf16+resets': (_opt, 'bf16', 'nearest', True),
      f'{_opt} fp8': (_opt, FP8, 'nearest', False),
      f'{_opt} fp8+resets': (_opt, FP8, 'nearest', True),
      f'{_opt} 8-bit': (_opt, '8-bit', 'stochastic', False),
      f'{_opt} 4-bit': (_opt, '4-bit', 'stochastic', False),
  })


@dataclasses.dataclass(frozen=True)
class Mode:
  steps: int
  seeds: tuple[int, ...]
  tiny: bool = False


MODES = {
    'full': Mode(500, (0, 1, 2)),
    'quick': Mode(150, (0, 1, 2)),
    'smoke': Mode(4, (0,), tiny=True),
}


def _formats(formats: str) -> dict[str, str]:
  if formats == '8-bit':
    return {}  # The constructors' defaults.
  if formats == '4-bit':
    return dict(stats_format='int4', eigvecs_format='int4')
  return dict(mu_format=formats, nu_format=formats, stats_format=formats,
              eigvecs_format=formats)


def make_optimizer(name: str, cfg: _common.RunConfig, seed: int
                   ) -> optax.GradientTransformation:
  """Clipping, then the optimizer of ``name`` (see ``CONFIGS``)."""
  opt, formats, rounding, resets = CONFIGS[name]
  if opt == 'adamw':
    return _common.make_optimizer(_common.FP32, cfg, seed)
  make = optax_q.shampoo if opt == 'shampoo' else optax_q.soap
  tx = make(
      _common.schedule(cfg), b1=cfg.b1, b2=B2, eps=cfg.eps,
      weight_decay=cfg.weight_decay,
      weight_decay_mask=lambda p: jax.tree.map(lambda x: x.ndim >= 2, p),
      max_preconditioner_dim=MAX_DIM,
      precondition_frequency=(SHAMPOO_FREQUENCY if opt == 'shampoo'
                              else SOAP_FREQUENCY),
      rounding=rounding, seed=seed, min_size=cfg.min_size,
      reset_every=RESET_EVERY if resets else None, **_formats(formats))
  return optax.chain(optax.clip_by_global_norm(cfg.clip_norm), tx)


def twin(name: str) -> str | None:
  """The float32 configuration a run of ``name`` is compared with (the same
  optimizer with every state in ``fp32``); ``None`` for a float32 one."""
  opt, formats, _, _ = CONFIGS[name]
  return None if formats in (None, 'fp32') else f'{opt} fp32'


def run_config(mode: Mode) -> _common.RunConfig:
  cfg = _common.RunConfig(steps=mode.steps)
  if mode.tiny:
    cfg = dataclasses.replace(cfg, d_model=32, num_layers=1, num_heads=2,
                              eval_every=2, eval_batches=2)
  return cfg


def train_rows(cfg: _common.RunConfig, seeds, corpus, names, rows: list, *,
               fidelity: bool = True) -> None:
  """Trains ``names`` over ``seeds``, appending a row per run to ``rows``.

  With ``fidelity``, a low-bit run trains beside its float32 :func:`twin`
  and its row gets the fidelity fields; a float32 one runs alone and gets
  ``_common.BASELINE_FIDELITY``. Bytes count the optimizer's own state.
  """
  model = _common.make_model(cfg)
  eval_fn = _common.make_eval_fn(cfg, corpus)
  for name in names:
    reference = twin(name) if fidelity else None
    for seed in seeds:
      params = _common.init_params(model, seed)
      n_params = sum(x.size for x in jax.tree.leaves(params))
      tx = make_optimizer(name, cfg, seed)
      if reference is not None:
        tx = optax_q.track_fidelity(
            tx, make_optimizer(reference, cfg, seed), steps=cfg.steps)
      result = train.train(
          model, params, tx,
          data.lm_batches(corpus.train, cfg.batch_size, cfg.seq_len,
                          seed=seed),
          steps=cfg.steps, loss_fn=train.lm_loss, eval_fn=eval_fn,
          eval_every=cfg.eval_every, progress=False, seed=0)
      times = (result.step_times[1:] if len(result.step_times) > 1
               else result.step_times)
      state_bytes = int(optax_q.state_nbytes(
          _common.inner_state(result.opt_state)))
      rows.append(dict(
          config=name, seed=seed, steps=cfg.steps,
          final_val_loss=float(result.eval_losses[-1]),
          state_bytes=state_bytes,
          bytes_per_param=state_bytes / n_params,
          step_ms_median=1e3 * float(np.median(times))))
      if reference is not None:
        rows[-1].update(_common.fidelity_fields(result.opt_state))
      elif fidelity:
        rows[-1].update(_common.BASELINE_FIDELITY)
      fid = (f"cosine {rows[-1]['cosine']:.4f} " if fidelity else '')
      print(f'{name:20s} seed {seed}: {rows[-1]["final_val_loss"]:.4f} '
            f'{fid}{rows[-1]["bytes_per_param"]:.2f} B/param '
            f'{rows[-1]["step_ms_median"]:.1f} ms', flush=True)
    jax.clear_caches()


# ----------------------------------------------------------------------------
# Summary and claims.
# ----------------------------------------------------------------------------


def summarize(rows) -> list[dict[str, Any]]:
  out = []
  for name in CONFIGS:
    mine = [r for r in rows if r['config'] == name]
    if not mine:
      continue
    losses = [r['final_val_loss'] for r in mine]
    finite = all(math.isfinite(v) for v in losses)
    out.append(dict(
        config=name, seeds=len(mine),
        mean=statistics.fmean(losses) if finite else math.nan,
        spread=(max(losses) - min(losses)) if finite else math.nan,
        sd=statistics.stdev(losses) if finite and len(losses) > 1 else 0.0,
        bytes_per_param=mine[0]['bytes_per_param'],
        state_bytes=mine[0]['state_bytes'],
        step_ms=statistics.median(r['step_ms_median'] for r in mine),
        **_common.fidelity_means(mine)))
  return out


def _by_name(summary):
  return {s['config']: s for s in summary}


def claims(summary) -> dict[str, Any]:
  """The targets, read off the summary."""
  s = _by_name(summary)
  out = {}
  for opt in ('shampoo', 'soap'):
    fp32 = s.get(f'{opt} fp32')
    if fp32 is None:
      continue
    for low in ('8-bit', '4-bit'):
      row = s.get(f'{opt} {low}')
      if row is None:
        continue
      out[f'{opt} {low}'] = dict(
          loss=row['mean'], fp32=fp32['mean'], fp32_spread=fp32['spread'],
          within_spread=abs(row['mean'] - fp32['mean']) <= fp32['spread'],
          bytes_ratio=row['state_bytes'] / fp32['state_bytes'],
          bytes_target_met=row['state_bytes'] <= 0.3 * fp32['state_bytes'])
    bf16, fp8, fp8r = (s.get(f'{opt} {k}')
                       for k in ('bf16', 'fp8', 'fp8+resets'))
    if bf16 and fp8 and fp8r:
      worse = fp8['mean'] - bf16['mean']
      out[f'{opt} table 7'] = dict(
          bf16=bf16['mean'], bf16_spread=bf16['spread'], fp8=fp8['mean'],
          fp8_resets=fp8r['mean'],
          fp8_clearly_worse=bool(worse > max(bf16['spread'], fp8['spread'])),
          resets_within_bf16_spread=bool(
              abs(fp8r['mean'] - bf16['mean']) <= bf16['spread']))
  return out


def plot(result, path) -> pathlib.Path:
  """Final validation loss per config: each seed, the mean and the range;
  bytes per parameter written at the right."""
  from matplotlib.figure import Figure  # pylint: disable=g-import-not-at-top
  summary, meta = result['summary'], result['meta']
  fig = Figure(figsize=(8.5, 0.32 * len(summary) + 1.8), layout='constrained')
  ax = fig.subplots()
  colors = {'adamw': '0.4', 'shampoo': 'C0', 'soap': 'C1'}
  finite = [r['final_val_loss'] for r in result['rows']
            if math.isfinite(r['final_val_loss'])]
  lo, hi = (min(finite), max(finite)) if finite else (0.0, 1.0)
  span = max(hi - lo, 1e-3 * max(abs(hi), 1.0))
  right = hi + 0.3 * span
  for j, s in enumerate(summary):
    opt = s['config'].split()[0]
    color = colors.get(opt, 'C2')
    seeds = [r['final_val_loss'] for r in result['rows']
             if r['config'] == s['config']]
    ok = [v for v in seeds if math.isfinite(v)]
    if s['config'].endswith(' fp32') and ok:
      # The float32 range of this optimizer, as a band behind its rows.
      ax.axvspan(min(ok), max(ok), color=color, alpha=0.12, lw=0)
    ax.plot(ok, [j] * len(ok), 'o', ms=3, color=color, alpha=0.5)
    if ok:
      ax.plot([min(ok), max(ok)], [j, j], '-', color=color, lw=1.5)
      ax.plot([statistics.fmean(ok)], [j], 'D', ms=6, color=color)
    ax.text(right, j, f"  {s['bytes_per_param']:.2f} B/param"
            + ('' if len(ok) == len(seeds) else
               f', {len(seeds) - len(ok)} diverged'),
            va='center', fontsize=7)
  ax.set_yticks(range(len(summary)))
  ax.set_yticklabels([s['config'] for s in summary], fontsize=8)
  ax.invert_yaxis()
  ax.set_xlim(lo - 0.05 * span, right)
  ax.set_xlabel('final validation loss (nats/byte): seeds (dots), mean '
                '(diamond), range (line); band: the fp32 range of each '
                'optimizer', fontsize=8)
  ax.grid(axis='x', alpha=0.3)
  ax.set_title(
      f"Shampoo and SOAP with low-bit state, LM benchmark, {meta['mode']} "
      f"mode: {meta['steps']} steps, seeds {meta['seeds']}", fontsize=9)
  fig.savefig(path, dpi=110)
  return pathlib.Path(path)



def render_markdown(result) -> str:
  """The results page; the fidelity columns (and the sentences on them)
  only when a configuration has fidelity, so results written without it
  render as they always did."""
  meta = result['meta']
  fidelity = any(s.get(key) is not None for s in result['summary']
                 for key in _common.FIDELITY)
  lines = [
      '# Shampoo and SOAP with low-bit state on the LM benchmark', '',
      'Generated by `examples/study_second_order.py`; do not edit by hand.',
      '',
      f"- Command: `{meta['command']}`"
      + (f" ({meta['note']})" if meta.get('note') else ''),
      f"- Git revision: `{meta['git_revision']}`",
      f"- Date: {meta['date']}",
      f"- Machine: {meta['machine']}",
      f"- Mode: {meta['mode']}: {meta['steps']} steps, seeds "
      f"{meta['seeds']}; {meta['seconds']:.0f} s in all.",
      f"- Settings: learning rate {LEARNING_RATE} (warm-up, cosine), b1 0.9, "
      f'b2 {B2} (moments and factor statistics), weight decay 0.1, clip 1.0; '
      f'blocks of at most {MAX_DIM}; refresh every {SHAMPOO_FREQUENCY} '
      f'(Shampoo) and {SOAP_FREQUENCY} (SOAP) steps; resets every '
      f'{RESET_EVERY} steps (`reset_period(fp8_e4m3, b2={B2})`).',
      '',
      'Loss: final validation loss, mean over seeds; spread = max - min. '
      'Bytes: the optimizer state\'s real buffers per parameter (float32 '
      'AdamW: 8). Step: median step time over seeds, refreshes included, '
      'taken with the machine shared (indicative only).'
      + (' Fidelity to the float32 twin, the same optimizer with every '
         'state in fp32 (Shampoo fp32, SOAP fp32) fed the same gradients '
         'and params (`optax_q.track_fidelity`, mean over the seeds that '
         'have it): the median over steps of the update-norm ratio and of '
         'the update cosine, and the final distance from the twin\'s '
         'weights relative to how far the twin moved; a float32 '
         'configuration is its own twin (1, 1, 0). '
         + (_common.fidelity_provenance(meta['fidelity'])
            if meta.get('fidelity') else
            "Step times of the runs beside a twin include the twin's.")
         if fidelity else ''), '',
      '![final validation loss per configuration](second_order.png)', '',
  ]
  rows = [[s['config'], f"{s['mean']:.4f}", f"{s['spread']:.4f}",
           *((_common.fidelity_cell(s.get(key)) for key in _common.FIDELITY)
             if fidelity else ()),
           f"{s['bytes_per_param']:.2f}", f"{s['step_ms']:.1f}"]
          for s in result['summary']]
  lines.append(_common.markdown_table(
      ['config', 'val loss', 'spread',
       *(('norm ratio', 'cosine', 'weight distance') if fidelity else ()),
       'bytes/param', 'step ms'], rows))
  lines += ['', '## Targets', '']
  for key, c in result['claims'].items():
    lines.append(f'- **{key}**: ' + ', '.join(
        f'{k} {v:.4f}' if isinstance(v, float) else f'{k} {v}'
        for k, v in c.items()))
  return '\n'.join(lines) + '\n'


def make_parser() -> argparse.ArgumentParser:
  parser = argparse.ArgumentParser(
      description=__doc__.split('\n\n')[0],
      formatter_class=_common.HelpFormatter)
  parser.add_argument('--mode', choices=sorted(MODES), default='full',
                      help='full: 500 steps, 3 seeds; quick: 150 steps, 3 '
                      'seeds; smoke: a few steps of a tiny model (for the '
                      'tests)')
  parser.add_argument('--configs', nargs='+', choices=list(CONFIGS),
                      help="optimizer and state-format configurations "
                      "trained ('<optimizer> <formats>[+resets]'; default: "
                      'all; with --add-fidelity, every low-bit one of the '
                      'result)')
  parser.add_argument('--seeds', type=int, nargs='+',
                      help="seeds trained (default: the mode's; required "
                      'with --add-fidelity)')
  _common.add_fidelity_arguments(parser)
  parser.add_argument('--update', action='store_true',
                      help='train only --configs and replace their rows in '
                      'the second_order.json in --out')
  parser.add_argument('--render', action='store_true',
                      help='only re-write second_order.{json,md,png} from the '
                      'rows of the second_order.json in --out (no '
                      'training)')
  parser.add_argument('--data', default=None,
                      help='train on this text file (default: the Python '
                      "standard library's own sources); its first "
                      '8,000,000 bytes either way')
  _common.add_out_argument(parser, __file__)
  return parser


def _finish(out: pathlib.Path, result) -> str:
  result['summary'] = summarize(result['rows'])
  result['claims'] = claims(result['summary'])
  return _write(out, result)


def _write(out: pathlib.Path, result) -> str:
  (out / 'second_order.json').write_text(
      json.dumps(result, indent=1, allow_nan=True) + '\n')
  md = render_markdown(result)
  (out / 'second_order.md').write_text(md)
  plot(result, out / 'second_order.png')
  return md


def add_fidelity(args, argv) -> str:
  """Reruns ``args.seeds`` of the result in ``args.out`` beside the float32
  twins, with the settings recorded in it, and adds their fidelity."""
  out = pathlib.Path(args.out)
  result = json.loads((out / 'second_order.json').read_text())
  meta, rows = result['meta'], result['rows']
  # The recorded run's settings, not this command's: its mode, steps and
  # model, and the corpus its command named.
  recorded = make_parser().parse_known_args(
      shlex.split(meta['command'])[2:])[0]
  if 'run_config' in meta:
    cfg = _common.RunConfig(**meta['run_config'])
  else:
    cfg = dataclasses.replace(run_config(MODES[meta['mode']]),
                              steps=meta['steps'])
  published = list(dict.fromkeys(r['config'] for r in rows))
  names = [n for n in args.configs or published
           if n in published and twin(n) is not None]
  missing = set(args.seeds) - {r['seed'] for r in rows}
  if missing:
    raise SystemExit(f'--add-fidelity: no published runs of seeds '
                     f'{sorted(missing)}')
  measured = []
  train_rows(cfg, args.seeds, data.load_corpus(meta.get('data',
                                                        recorded.data)),
             names, measured)
  meta['fidelity'] = _common.merge_fidelity(
      rows, measured, command=_common.command_line(__file__, argv),
      seeds=args.seeds, float32=lambda row: twin(row['config']) is None,
      previous=meta.get('fidelity'))
  for s in result['summary']:
    s.update(_common.fidelity_means(
        [r for r in rows if r['config'] == s['config']]))
  print(json.dumps(meta['fidelity'], indent=1))
  return _write(out, result)


def main(argv=None):
  parser = make_parser()
  args = parser.parse_args(argv)
  out = pathlib.Path(args.out)
  if args.render:
    return _finish(out, json.loads((out / 'second_order.json').read_text()))
  if args.add_fidelity:
    if not args.seeds:
      parser.error('--add-fidelity needs --seeds')
    return add_fidelity(args, argv)
  mode = MODES[args.mode]
  if args.seeds:
    mode = dataclasses.replace(mode, seeds=tuple(args.seeds))
  configs = args.configs or list(CONFIGS)
  cfg = run_config(mode)
  start = time.time()
  rows = []
  if args.update:
    previous = json.loads((out / 'second_order.json').read_text())
    rows = [r for r in previous['rows'] if r['config'] not in configs]
  corpus = data.load_corpus(args.data)
  out.mkdir(parents=True, exist_ok=True)
  meta = dict(command=_common.command_line(__file__, argv),
              git_revision=_common.git_revision(), date=_common.now_utc(),
              machine=_common.machine(), mode=args.mode, steps=mode.steps,
              seeds=list(mode.seeds), data=args.data,
              run_config=dataclasses.asdict(cfg))
  md = ''
  for name in configs:
    rows = [r for r in rows if r['config'] != name]
    train_rows(cfg, mode.seeds, corpus, [name], rows,
               fidelity=args.fidelity)
    # Written after every config, so a long run keeps what it measured.
    meta['seconds'] = time.time() - start
    md = _finish(out, dict(meta=meta, rows=rows))
  print(json.dumps(claims(summarize(rows)), indent=1))
  print(f'wrote {out}/second_order.{{json,md,png}}')
  return md


if __name__ == '__main__':
  main()

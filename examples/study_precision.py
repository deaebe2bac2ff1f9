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
r"""The precision study: final loss against optimizer-state bits.

Trains the small GPT on the byte-level standard-library corpus with AdamW
whose moments are stored in fp32 (``optax.adamw``), bf16, fp8 e4m3,
int8 (dynamic map) and 4 bits (fp4 e2m1 first moment, zero-free e2m2
second moment), each with round-to-nearest (``/rn``) and stochastic
rounding (``/sr``), for several seeds. A seed fixes the parameter init, the
batch order and the rounding bits, so every configuration sees the same
init and data as fp32 in the same seed, and the gap to fp32 is paired.

Writes ``<out>/precision.json`` (command, revision, date, machine, mode,
one row per configuration and seed), ``precision.md`` (mean and spread per
configuration, the paired gap to fp32 and the verdict against the targets)
and ``precision.png`` (final loss against bits per state element); ``--out``
is ``runs/study_precision/`` in the repository (git-ignored) unless given.
With ``--doc PAGE`` it also refreshes the results block of that page. The
published results are written only when asked for, into ``docs/results``
and ``docs/precision.md``::

  python examples/study_precision.py --mode quick   # a few minutes
  python examples/study_precision.py --mode full    # under an hour, 2 cores
  python examples/study_precision.py --mode quick \
      --out docs/results --doc docs/precision.md    # the published table

Each low-precision run also trains beside its float32 twin
(``optax_q.track_fidelity``, off with ``--no-fidelity``), and the table
shows its fidelity to it: update-norm ratio and cosine (medians over the
steps) and final weight distance. A loss below fp32's with a norm ratio
above one is a larger effective step, not more precision.

Targets: fp8 and int8_dynamic with stochastic rounding within the fp32 seed
spread or at most +0.5 %; 4-bit with stochastic rounding at most +1 %.
"""

import argparse
import dataclasses
import json
import math
import pathlib
import re
import statistics
import time

import _common  # pylint: disable=g-bad-import-order

CONFIGS = (
    'fp32',
    'bf16/rn', 'bf16/sr',
    'fp8_e4m3/rn', 'fp8_e4m3/sr',
    'int8_dynamic/rn', 'int8_dynamic/sr',
    '4bit/rn', '4bit/sr',
)

# Quick: a smaller model and fewer steps, still 3 seeds; for CI and the
# README. Full: the demo's model and batches, twice as many steps.
MODES = {
    'quick': _common.RunConfig(
        d_model=64, num_layers=1, num_heads=4, seq_len=64, batch_size=16,
        steps=200, learning_rate=3e-3, warmup_steps=20, eval_every=50,
        eval_batches=16),
    'full': _common.RunConfig(
        d_model=128, num_layers=2, num_heads=4, seq_len=64, batch_size=16,
        steps=1000, learning_rate=3e-3, warmup_steps=100, eval_every=200,
        eval_batches=32),
}

# name -> (relative gap bound, also pass within the fp32 seed spread).
TARGETS = {
    'fp8_e4m3/sr': (0.005, True),
    'int8_dynamic/sr': (0.005, True),
    '4bit/sr': (0.01, False),
}

OVERRIDES = ('d_model', 'num_layers', 'num_heads', 'seq_len', 'batch_size',
             'steps', 'eval_every', 'eval_batches', 'max_bytes')

NAME = 'precision'


def doc_markers(name: str = NAME) -> tuple[str, str]:
  """The comments that delimit the results block of ``name`` in a page."""
  return f'<!-- {name}-results:begin -->', f'<!-- {name}-results:end -->'


DOC_BEGIN, DOC_END = doc_markers()


# ----------------------------------------------------------------------------
# Statistics.
# ----------------------------------------------------------------------------


def _std(xs):
  return statistics.stdev(xs) if len(xs) > 1 else 0.0


def summarize(rows):
  """Per-configuration aggregates and the paired gap to fp32."""
  by = {}
  for r in rows:
    by.setdefault(r['config'], {})[r['seed']] = r
  base = by.get('fp32', {})
  base_losses = [r['final_val_loss'] for r in base.values()]
  spread = _std(base_losses)
  out = []
  for name, seeds in by.items():
    losses = [r['final_val_loss'] for r in seeds.values()]
    paired = sorted(set(seeds) & set(base))
    gaps = [seeds[s]['final_val_loss'] - base[s]['final_val_loss']
            for s in paired]
    rel = [g / base[s]['final_val_loss'] for g, s in zip(gaps, paired)]
    ratios = [seeds[s]['step_ms_median'] / base[s]['step_ms_median']
              for s in paired]
    first = next(iter(seeds.values()))
    summary = dict(
        config=name,
        seeds=sorted(seeds),
        mean_val_loss=statistics.fmean(losses),
        std_val_loss=_std(losses),
        mean_gap=statistics.fmean(gaps) if gaps else math.nan,
        std_gap=_std(gaps),
        mean_rel_gap=statistics.fmean(rel) if rel else math.nan,
        fp32_seed_spread=spread,
        state_bytes=first['state_bytes'],
        state_bits_per_element=first['state_bits_per_element'],
        quantized_elements=first['quantized_elements'],
        step_ms_median=statistics.median(
            r['step_ms_median'] for r in seeds.values()),
        step_ratio_to_fp32=(statistics.median(ratios) if ratios
                            else math.nan),
        **_common.fidelity_means(seeds.values()),
    )
    summary.update(verdict(name, summary))
    out.append(summary)
  return out


def verdict(name, s):
  """``target`` and ``met`` (``None`` for configurations without one)."""
  if name not in TARGETS:
    return dict(target='', met=None)
  bound, spread_ok = TARGETS[name]
  text = f'<= +{100 * bound:g}%'
  met = s['mean_rel_gap'] <= bound
  if spread_ok:
    text = f'within fp32 seed spread or {text}'
    met = met or abs(s['mean_gap']) <= s['fp32_seed_spread']
  return dict(target=text, met=bool(met))


# ----------------------------------------------------------------------------
# Outputs.
# ----------------------------------------------------------------------------



def render_markdown(meta, summary):
  """The results page: provenance, then the table.

  The fidelity columns (and the sentences that explain them) appear only
  when a configuration has fidelity, so results written without it render
  as they always did.
  """
  fidelity = any(s.get(key) is not None for s in summary
                 for key in _common.FIDELITY)
  header = ('config', 'bits/elem', 'state bytes', 'final val loss',
            'gap to fp32 (same seeds)', 'rel. gap',
            *(('norm ratio', 'cosine', 'weight distance') if fidelity
              else ()),
            'step ms (vs fp32)', 'target', 'met')
  rows = []
  for s in summary:
    met = {None: '', True: 'yes', False: '**no**'}[s['met']]
    rows.append((
        f"`{s['config']}`",
        f"{s['state_bits_per_element']:.2f}",
        f"{s['state_bytes']:,}",
        f"{s['mean_val_loss']:.4f} ± {s['std_val_loss']:.4f}",
        ('—' if s['config'] == 'fp32' else
         f"{s['mean_gap']:+.4f} ± {s['std_gap']:.4f}"),
        ('—' if s['config'] == 'fp32' else
         f"{100 * s['mean_rel_gap']:+.2f}%"),
        *((_common.fidelity_cell(s.get(key)) for key in _common.FIDELITY)
          if fidelity else ()),
        f"{s['step_ms_median']:.0f} ({s['step_ratio_to_fp32']:.2f}x)",
        s['target'], met))
  fidelity_text = (
      " Fidelity to a float32 AdamW twin fed the same gradients and params "
      "(`optax_q.track_fidelity`, mean over the seeds that have it): the "
      "median over steps "
      "of the update-norm ratio (above one: larger steps than float32's) "
      "and of the update cosine, and the final distance from the twin's "
      "weights relative to how far the twin moved; fp32 is its own twin "
      "(1, 1, 0). A loss below fp32's with a norm ratio above one is a "
      "larger effective step, not more precision. "
      + ("The step times are the published runs', without the twin."
         if meta.get('fidelity') else
         "The step times of the tracked runs include the twin's "
         "(`--no-fidelity` times them alone).")
      if fidelity else '')
  cfg = meta['run_config']
  n_seeds = len(meta['seeds'])
  lines = [
      f"Mode `{meta['mode']}`: GPT d_model={cfg['d_model']}, "
      f"{cfg['num_layers']} layer{'s' if cfg['num_layers'] != 1 else ''}, "
      f"{meta['num_params']:,} params; "
      f"{cfg['steps']} steps of {cfg['batch_size']}x{cfg['seq_len']} bytes; "
      f"peak lr {cfg['learning_rate']:g}, warm-up then cosine, clip "
      f"{cfg['clip_norm']:g}, weight decay {cfg['weight_decay']:g}; "
      f"seeds {', '.join(map(str, meta['seeds']))}. "
      f"{100 * meta['quantized_elements']:.1f}% of the moment elements are "
      f"quantized (leaves under {cfg['min_size']} elements stay float32).",
      '',
      _common.markdown_table(header, rows),
      '',
      f'Loss: validation cross entropy (nats per byte) after the last step, '
      f'mean ± standard deviation over {n_seeds} seeds. Gap: the paired '
      f'difference to fp32 in the same seed (same init and batches), mean ± '
      f'standard deviation. The fp32 seed spread (standard deviation) is '
      f"{summary[0]['fp32_seed_spread']:.4f}. Step time: median over the "
      f'seeds of each run\'s median step (compilation excluded), runs one '
      f'after another on the same machine, so only ratios mean much.'
      f'{fidelity_text}',
      *(('', _common.fidelity_provenance(meta['fidelity']))
        if meta.get('fidelity') else ()),
      '',
      f"- Command: `{meta['command']}`",
      f"- Revision: `{meta['git_revision']}`; date: {meta['date']}; "
      f"wall time {meta['wall_s'] / 60:.1f} min",
      f"- Machine: {meta['machine']}; load average (1/5/15 min) "
      f"{meta['load_average_start']} at the start, "
      f"{meta['load_average_end']} at the end",
  ]
  if meta.get('modified_paths'):
    lines.append('- Uncommitted changes at run time in: ' + ', '.join(
        f'`{p}`' for p in meta['modified_paths']))
  if meta.get('note'):
    lines.append(f"- Note: {meta['note']}")
  return '\n'.join(lines) + '\n'


def plot_frontier(summary, path, title):
  """Final loss, and the paired gap to fp32, against state bits/element."""
  # pylint: disable-next=import-outside-toplevel
  from matplotlib.figure import Figure
  fig = Figure(figsize=(11, 4.5), layout='constrained')
  ax_loss, ax_gap = fig.subplots(1, 2)
  base = next((s for s in summary if s['config'] == 'fp32'), None)
  if base is not None:
    ax_loss.axhspan(base['mean_val_loss'] - base['std_val_loss'],
                    base['mean_val_loss'] + base['std_val_loss'],
                    color='0.88', label='fp32 ± seed std')
  ax_gap.axhline(0.0, color='0.5', lw=1)
  for bound, style in ((0.5, '--'), (1.0, ':')):
    ax_gap.axhline(bound, color='k', ls=style, lw=0.8,
                   label=f'+{bound:g}% target')
  families = {}
  for s in summary:
    families.setdefault(s['config'].split('/')[0], len(families))
  for s in summary:
    fam, _, tag = s['config'].partition('/')
    color = f'C{families[fam] % 10}'
    filled = tag != 'rn'
    # Formats with equal bits sit side by side: spread them a little.
    x = s['state_bits_per_element'] * 2 ** (
        0.03 * (families[fam] % 3 - 1) + (0.012 if filled else -0.012))
    style = dict(fmt='o' if filled else 's', color=color, ms=7, capsize=3,
                 mfc=color if filled else 'white', label=s['config'])
    ax_loss.errorbar(x, s['mean_val_loss'], yerr=s['std_val_loss'], **style)
    if s['config'] != 'fp32':
      ax_gap.errorbar(x, 100 * s['mean_rel_gap'],
                      yerr=100 * s['std_gap'] / s['mean_val_loss'], **style)
  for ax in (ax_loss, ax_gap):
    ax.set_xscale('log', base=2)
    ax.set_xticks([4, 8, 16, 32])
    ax.set_xticklabels(['4', '8', '16', '32'])
    ax.set_xlabel('optimizer-state bits per moment element')
    ax.grid(alpha=0.3)
  ax_loss.set_ylabel('final validation loss (nats/byte), mean ± std')
  ax_gap.set_ylabel('gap to fp32 in the same seed (%), mean ± std')
  ax_loss.legend(fontsize=7, ncol=2)
  ax_gap.legend(fontsize=7, ncol=2)
  fig.suptitle(title, fontsize=10)
  path = pathlib.Path(path)
  path.parent.mkdir(parents=True, exist_ok=True)
  fig.savefig(path, dpi=110)
  return path


def write_outputs(result, out, doc, name=NAME):
  """``<name>.{json,md,png}`` in ``out``; the results block of ``doc``."""
  out = pathlib.Path(out)
  (out / f'{name}.json').write_text(json.dumps(result, indent=1) + '\n')
  md = render_markdown(result, result['summary'])
  (out / f'{name}.md').write_text(
      f"# Precision study ({result['mode']} mode)\n\n"
      f'Written by `examples/study_precision.py`; do not edit.\n\n'
      f'![final validation loss against state bits per element]({name}.png)'
      '\n\n' + md)
  cfg = result['run_config']
  plot_frontier(
      result['summary'], out / f'{name}.png',
      f"Precision study, {result['mode']} mode: GPT "
      f"{result['num_params'] / 1e6:.2f}M params, {cfg['steps']} steps, "
      f"{len(result['seeds'])} seeds")
  if doc:
    update_doc(doc, md, name)
  return md


def update_doc(doc, results_md, name=NAME):
  """Replace the block between the markers of ``doc`` with the results."""
  begin, end = doc_markers(name)
  doc = pathlib.Path(doc)
  text = doc.read_text()
  if begin not in text or end not in text:
    raise ValueError(f'{doc} has no {begin} ... {end} block')
  block = f'{begin}\n{results_md}{end}'
  text = re.sub(re.escape(begin) + '.*?' + re.escape(end),
                lambda _: block, text, flags=re.S)
  doc.write_text(text)


# ----------------------------------------------------------------------------
# Main.
# ----------------------------------------------------------------------------


def make_parser() -> argparse.ArgumentParser:
  """The flags of :func:`main`."""
  parser = argparse.ArgumentParser(
      description=__doc__.split('\n')[0],
      formatter_class=_common.HelpFormatter)
  parser.add_argument('--mode', choices=sorted(MODES), default='quick',
                      help='quick: a tiny GPT, minutes; full: the demo GPT, '
                      'about half an hour')
  parser.add_argument('--seeds', type=int, nargs='+', default=[0, 1, 2],
                      help='seeds; each runs every config')
  parser.add_argument('--configs', nargs='+', default=None,
                      help="'fp32' first, then <mu>[+<nu>]/<rn|sr> (default: "
                      'the study\'s list; with --add-fidelity, the published '
                      "result's)")
  _common.add_out_argument(parser, __file__)
  parser.add_argument(
      '--name', default=NAME,
      help='stem of the result files and name of the doc block')
  parser.add_argument(
      '--doc', default='',
      help='page whose results block is refreshed, e.g. docs/precision.md '
      "('' for none)")
  parser.add_argument('--note', default='',
                      help='a remark recorded with the results')
  parser.add_argument(
      '--render', action='store_true',
      help='only re-render the table, plot and doc from the JSON in '
      '--out (no training)')
  parser.add_argument('--no-progress', action='store_true',
                      help='no progress bars (for logs)')
  _common.add_fidelity_arguments(parser)
  parser.add_argument('--data', default=None,
                      help='train on this text file instead of the stdlib')
  # Overrides of the mode's model and schedule (for smoke tests).
  for flag in OVERRIDES:
    parser.add_argument('--' + flag.replace('_', '-'), type=int,
                        help="override the mode's value")
  return parser


def main(argv=None):
  parser = make_parser()
  args = parser.parse_args(argv)
  overrides = {k: v for k in OVERRIDES if (v := getattr(args, k)) is not None}
  cfg = dataclasses.replace(MODES[args.mode], **overrides)
  out = pathlib.Path(args.out)
  if args.render:
    result = json.loads((out / f'{args.name}.json').read_text())
    result['summary'] = summarize(result['rows'])
    print(write_outputs(result, out, args.doc, args.name))
    return result
  if args.add_fidelity:
    return add_fidelity(args, argv, out)
  args.configs = args.configs or list(CONFIGS)
  if args.configs[0] != 'fp32':
    parser.error("the first config must be 'fp32' (the baseline)")
  opts = [_common.parse_config(c) for c in args.configs]
  out.mkdir(parents=True, exist_ok=True)
  partial = out / f'{args.name}.partial.json'

  t_start = time.perf_counter()
  meta = dict(
      command=_common.command_line(__file__, argv),
      git_revision=_common.git_revision(),
      modified_paths=_common.git_modified_paths(),
      date=_common.now_utc(),
      machine=_common.machine(),
      load_average_start=_common.load_average(),
      mode=args.mode,
      note=args.note,
      seeds=list(args.seeds),
      configs=[o.name for o in opts],
      run_config=dataclasses.asdict(cfg),
  )
  corpus = _common.load_corpus(cfg, args.data)
  model = _common.make_model(cfg)
  eval_fn = _common.make_eval_fn(cfg, corpus)
  meta.update(num_params=model.num_params(), corpus=corpus.fingerprint)
  n_runs = len(opts) * len(args.seeds)
  print(f'{args.mode} mode: {n_runs} runs of {cfg.steps} steps, '
        f'{meta["num_params"]:,} params')

  rows = []
  # Seeds outer: every configuration is spread over the whole study, so
  # slow phases of a shared machine hit all of them alike.
  for seed in args.seeds:
    for opt in opts:
      row, _ = _common.run(opt, cfg, corpus, seed=seed, model=model,
                           eval_fn=eval_fn, progress=not args.no_progress,
                           fidelity=args.fidelity)
      rows.append(row)
      fid = (f"norm ratio {row['norm_ratio']:.3f}, cosine "
             f"{row['cosine']:.3f}, weight distance "
             f"{row['weight_distance']:.3f}, " if args.fidelity else '')
      print(f"[{len(rows)}/{n_runs}] {opt.name:18s} seed {seed}: "
            f"val {row['final_val_loss']:.4f}, {fid}"
            f"{row['state_bits_per_element']:.2f} bits/elem, "
            f"{row['step_ms_median']:.0f} ms/step "
            f"({time.perf_counter() - t_start:.0f} s)", flush=True)
      partial.write_text(json.dumps(dict(meta, rows=rows), indent=1) + '\n')

  summary = summarize(rows)
  meta.update(
      wall_s=time.perf_counter() - t_start,
      load_average_end=_common.load_average(),
      quantized_elements=max(s['quantized_elements'] for s in summary),
  )
  result = dict(meta, targets={k: dict(rel_gap=b, or_within_seed_spread=o)
                               for k, (b, o) in TARGETS.items()},
                summary=summary, rows=rows)
  md = write_outputs(result, out, args.doc, args.name)
  partial.unlink(missing_ok=True)
  print()
  print(md)
  return result


def add_fidelity(args, argv, out):
  """``--add-fidelity``: reruns ``args.seeds`` of the published result
  ``<out>/<name>.json`` beside float32 twins, with the run configuration and
  corpus recorded there, and adds their fidelity to its rows
  (``_common.merge_fidelity``); the rest of the result is kept."""
  path = out / f'{args.name}.json'
  result = json.loads(path.read_text())
  cfg = _common.RunConfig(**result['run_config'])
  corpus = _common.load_corpus(cfg, args.data)
  if corpus.fingerprint != result['corpus']:
    raise ValueError(f'{path} was trained on another corpus '
                     f"({result['corpus']}); pass the same --data")
  names = [c for c in (args.configs or result['configs']) if c != 'fp32']
  unknown = sorted(set(names) - set(result['configs']))
  if unknown:
    raise ValueError(f'{path} has no configurations {unknown}')
  missing = sorted(set(args.seeds) - set(result['seeds']))
  if missing:
    raise ValueError(f'{path} has no seeds {missing}')
  model = _common.make_model(cfg)
  eval_fn = _common.make_eval_fn(cfg, corpus)
  measured = []
  for seed in args.seeds:
    for name in names:
      row, _ = _common.run(_common.parse_config(name), cfg, corpus, seed=seed,
                           model=model, eval_fn=eval_fn,
                           progress=not args.no_progress, fidelity=True)
      measured.append(row)
      print(f"{name:18s} seed {seed}: val {row['final_val_loss']:.4f}, norm "
            f"ratio {row['norm_ratio']:.3f}, cosine {row['cosine']:.3f}, "
            f"weight distance {row['weight_distance']:.3f}", flush=True)
  result['fidelity'] = _common.merge_fidelity(
      result['rows'], measured, command=_common.command_line(__file__, argv),
      seeds=args.seeds, float32=lambda row: row['config'] == 'fp32',
      previous=result.get('fidelity'))
  result['summary'] = summarize(result['rows'])
  md = write_outputs(result, out, args.doc, args.name)
  print(md)
  return result


if __name__ == '__main__':
  main()

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
r"""How much one write-back of a real Adam state changes the next update.

Trains the precision study's GPT with float32 AdamW, takes its moments, and
stores them once in each format (the way ``quantize_state`` does, second
moments in their unsigned variant), then compares the bias-corrected Adam
direction ``m_hat / (sqrt(v_hat) + eps)`` computed from the decoded moments
with the float32 one, over every quantized leaf:

* relative error: ``||u_q - u|| / ||u||``;
* ``v -> 0``: the fraction of positive second moments decoded as zero;
* ``|u| > 10 max``: the fraction of elements whose update exceeds ten times
  the largest float32 update of its leaf (a blown-up coordinate).

``--no-floor`` stores second moments without the positive floor
(:attr:`optax_q.Format.positive_floor`), as the library did before it.

Writes ``<name>.json``, ``<name>.md`` and ``<name>.png`` (the relative
error per format pair and rounding; ``update_error`` unless ``--name`` says
otherwise) to ``--out``, by default ``runs/update_error/`` in the repository
(git-ignored). ``--compare <stem>`` draws the rows of ``<out>/<stem>.json``
in the plot too (the run without the floor next to the one with it).
``--render`` re-writes the page and the plot from the saved JSON without
measuring. The published results are written only when asked for, with
``--out docs/results``::

  python examples/update_error.py --out docs/results
  python examples/update_error.py --no-floor --name update_error_no_floor \
      --out docs/results
  python examples/update_error.py --render --name update_error_no_floor \
      --compare update_error --out docs/results
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import optax

import _common  # pylint: disable=g-bad-import-order
import study_precision  # pylint: disable=g-bad-import-order

optax_q = _common.optax_q

PAIRS = (('bf16', 'bf16'), ('fp8_e4m3', 'fp8_e4m3'), ('fp8_e5m2', 'fp8_e5m2'),
         ('int8_dynamic', 'int8_dynamic'), ('int8', 'int8'),
         ('fp4_e2m1', 'fp4_e2m1'), ('int4', 'int4'),
         # The low-bit codecs; with an exact first moment, the second
         # moment's share of the error alone.
         ('nf4', 'ue4m0'), ('nf4', 'ue4m0@rsqrt'), ('nf4', 'int4_mulaw'),
         ('nf3', 'ue3m0'), ('fp32', 'fp8_e4m3'), ('fp32', 'fp4_e2m1'),
         ('fp32', 'ue4m0'), ('fp32', 'ue4m0@rsqrt'), ('fp32', 'ue3m1'),
         ('fp32', 'int4_mulaw'), ('fp32', 'int4_sqrt'), ('fp32', 'ue3m0'),
         ('nf4', 'fp32'), ('fp4_e2m1', 'fp32'), ('int4', 'fp32'),
         # fp8 with dynamic range expansion (COAT), and second moments with
         # rank-1 normalisation (a name ending in ' rank1': a scale per row
         # and per column, Li et al. 2023; leaves of rank < 2 keep blocks).
         ('fp8_e4m3_dre', 'fp8_e4m3_dre'), ('fp8_e4m3_dre', 'fp32'),
         ('fp32', 'fp8_e4m3_dre'), ('fp32', 'int4 rank1'),
         ('fp32', 'fp4_e2m1 rank1'), ('fp32', 'ue4m0 rank1'),
         ('fp32', 'int4_mulaw rank1'), ('fp32', 'ue3m0 rank1'),
         ('fp32', 'int3_mulaw rank1'), ('nf4', 'ue4m0 rank1'))


def _nu_format(name: str, floor: bool):
  fmt = optax_q.unsigned_variant(optax_q.get_format(name))
  return fmt if floor else dataclasses.replace(fmt, positive_floor=False)


def _adam_state(opt_state) -> optax.ScaleByAdamState:
  for node in jax.tree.leaves(
      opt_state, is_leaf=lambda x: isinstance(x, optax.ScaleByAdamState)):
    if isinstance(node, optax.ScaleByAdamState):
      return node
  raise ValueError('no ScaleByAdamState in the optimizer state')


def measure(adam, cfg, *, floor: bool, block_size: int):
  """One row per (format pair, rounding)."""
  t = int(adam.count)

  def direction(m, v):
    m_hat = m / (1 - cfg.b1**t)
    v_hat = v / (1 - cfg.b2**t)
    return m_hat / (jnp.sqrt(v_hat) + cfg.eps)

  leaves = [(m, v) for m, v in zip(jax.tree.leaves(adam.mu),
                                   jax.tree.leaves(adam.nu))
            if m.size >= cfg.min_size]
  rows = []
  for mu_name, nu_spec in PAIRS:
    nu_name, _, nu_mode = nu_spec.partition(' ')
    nu_fmt = _nu_format(nu_name, floor)
    for rounding in ('nearest', 'stochastic'):
      err2 = ref2 = 0.0
      zeros = blown = total = 0
      for i, (m, v) in enumerate(leaves):
        kw = dict(block_size=block_size, rounding=rounding)
        qm = optax_q.dequantize(
            optax_q.quantize(m, mu_name, seed=2 * i, **kw))
        mode = nu_mode if nu_mode and v.ndim >= 2 else None
        qv = optax_q.dequantize(
            optax_q.quantize(v, nu_fmt, seed=2 * i + 1, scale_mode=mode,
                             **kw))
        ref, got = direction(m, v), direction(qm, qv)
        err2 += float(jnp.sum((got - ref) ** 2))
        ref2 += float(jnp.sum(ref**2))
        zeros += int(jnp.sum((qv == 0) & (v > 0)))
        blown += int(jnp.sum(jnp.abs(got) > 10 * jnp.max(jnp.abs(ref))))
        total += v.size
      rows.append(dict(mu_format=mu_name,
                       nu_format=nu_fmt.name + (f' {nu_mode}' if nu_mode
                                                else ''),
                       positive_floor=nu_fmt.positive_floor,
                       rounding=rounding,
                       relative_error=float(np.sqrt(err2 / ref2)),
                       nu_zero_fraction=zeros / total,
                       blown_up_fraction=blown / total, elements=total))
  return rows


def _pair(row) -> str:
  return f"{row['mu_format']} / {row['nu_format']}"


def _floor_tag(rows) -> str:
  floors = {r['positive_floor'] for r in rows}
  return {frozenset([True]): 'with the floor',
          frozenset([False]): 'no floor'}.get(
              frozenset(floors), 'with the floor (grids with a zero)')


def plot(result, path, title, compare=None):
  """Relative error of the next Adam direction per format pair, one bar
  per rounding (log scale); ``compare``: another result whose rows of the
  same pairs are drawn next to these, hatched. The fraction of second
  moments decoded as zero is written where it is not 0."""
  from matplotlib.figure import Figure  # pylint: disable=g-import-not-at-top
  rows = result['rows']
  pairs = list(dict.fromkeys(_pair(r) for r in rows))
  series = [(result, '', 1.0)]
  if compare is not None:
    series.append((compare, '///', 0.45))
  series = [(res, hatch, alpha, rounding) for res, hatch, alpha in series
            for rounding in ('nearest', 'stochastic')]
  height = 0.8 / len(series)
  fig = Figure(figsize=(9, 0.25 * len(pairs) * len(series) / 2 + 1.8),
               layout='constrained')
  ax = fig.subplots()
  values, noted = [], False
  for k, (res, hatch, alpha, rounding) in enumerate(series):
    by_pair = {_pair(r): r for r in res['rows'] if r['rounding'] == rounding}
    ys, xs, notes = [], [], []
    for j, pair in enumerate(pairs):
      r = by_pair.get(pair)
      if r is None:
        continue
      ys.append(j - 0.4 + height * (k + 0.5))
      xs.append(r['relative_error'])
      notes.append(r['nu_zero_fraction'])
    values += xs
    ax.barh(ys, xs, height=height, color='C0' if rounding == 'nearest'
            else 'C1', alpha=alpha, hatch=hatch, edgecolor='white' if
            not hatch else 'k', lw=0,
            label=f"{rounding}, {_floor_tag(res['rows'])}")
    for y, x, zero in zip(ys, xs, notes):
      if zero:
        noted = True
        ax.text(x * 1.15, y, f'v -> 0: {zero:.1e}', va='center', fontsize=6)
  ax.set_xscale('log')
  positive = [v for v in values if v > 0] or [1e-3]
  ax.set_xlim(min(positive) / 2,
              max(2.0, max(positive) * (30 if noted else 3)))
  ax.axvline(1.0, color='k', lw=0.6, ls='--')
  ax.set_yticks(range(len(pairs)))
  ax.set_yticklabels(pairs, fontsize=7)
  ax.invert_yaxis()
  ax.set_xlabel('relative error of the next Adam direction, '
                '||u_q - u|| / ||u|| (log scale; dashed: 1)', fontsize=8)
  ax.grid(axis='x', alpha=0.3)
  ax.legend(fontsize=7, loc='lower right')
  ax.set_title(title, fontsize=9)
  fig.savefig(path, dpi=110)
  return path


def render_markdown(result, name: str) -> str:
  meta, rows = result['meta'], result['rows']
  table = _common.markdown_table(
      ('mu', 'nu (stored as)', 'rounding', 'relative error', 'v -> 0',
       '|u| > 10 max'),
      [(r['mu_format'], r['nu_format'] + (' +floor' if r['positive_floor']
                                          else ''), r['rounding'],
        f"{r['relative_error']:.4f}", f"{r['nu_zero_fraction']:.1e}",
        f"{r['blown_up_fraction']:.1e}") for r in rows])
  return (f"# Update error of one write-back\n\n"
          f"Written by `examples/update_error.py`; do not edit.\n\n"
          f"The float32 AdamW state of the precision study's full-mode GPT "
          f"after {meta['steps']} steps (seed {meta['seed']}), stored once "
          f"in each format (block size {meta['run_config']['block_size']}); "
          f"error of the next Adam direction against float32, over "
          f"{rows[0]['elements']:,} quantized elements.\n\n"
          f"![relative error per format pair and rounding]({name}.png)"
          f"\n\n{table}\n\n"
          f"- Command: `{meta['command']}`\n"
          f"- Revision: `{meta['git_revision']}`; date: {meta['date']}\n"
          f"- Machine: {meta['machine']}\n")


def write_outputs(result, out, name, compare=None) -> str:
  """``<name>.md`` and ``<name>.png`` in ``out``; returns the page."""
  text = render_markdown(result, name)
  (out / f'{name}.md').write_text(text)
  meta = result['meta']
  title = (f"Update error of one write-back: float32 AdamW state after "
           f"{meta['steps']} steps (seed {meta['seed']}), block size "
           f"{meta['run_config']['block_size']}\n{name}.json: "
           f"{_floor_tag(result['rows'])}")
  if compare is not None:
    title += (f"; hatched: {compare[0]}.json, "
              f"{_floor_tag(compare[1]['rows'])}")
  plot(result, out / f'{name}.png', title,
       None if compare is None else compare[1])
  return text


def make_parser() -> argparse.ArgumentParser:
  """The flags of :func:`main`."""
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0],
                                   formatter_class=_common.HelpFormatter)
  parser.add_argument('--steps', type=int, default=500,
                      help='float32 AdamW steps before the state is taken')
  parser.add_argument('--seed', type=int, default=0,
                      help='seed of the model, the data and the rounding')
  parser.add_argument('--no-floor', action='store_true',
                      help='second moments without the positive floor')
  parser.add_argument('--name', default='update_error',
                      help='stem of the result files in --out')
  parser.add_argument('--compare', default=None, metavar='STEM',
                      help='also draw the rows of <out>/STEM.json in the '
                      'plot (e.g. update_error next to update_error_no_floor)')
  parser.add_argument('--render', action='store_true',
                      help='no training: re-write <name>.md and <name>.png '
                      'from the <name>.json in --out')
  _common.add_out_argument(parser, __file__)
  return parser


def main(argv=None):
  args = make_parser().parse_args(argv)
  out = pathlib.Path(args.out)
  compare = None
  if args.compare:
    compare = (args.compare,
               json.loads((out / f'{args.compare}.json').read_text()))
  if args.render:
    result = json.loads((out / f'{args.name}.json').read_text())
    write_outputs(result, out, args.name, compare)
    print(f'wrote {out}/{args.name}.{{md,png}}')
    return result['rows']
  cfg = dataclasses.replace(study_precision.MODES['full'], steps=args.steps,
                            eval_every=args.steps)
  corpus = _common.load_corpus(cfg)
  _, result = _common.run(_common.FP32, cfg, corpus, seed=args.seed,
                          progress=False)
  rows = measure(_adam_state(result.opt_state), cfg,
                 floor=not args.no_floor, block_size=cfg.block_size)
  meta = dict(command=_common.command_line(__file__, argv),
              git_revision=_common.git_revision(), date=_common.now_utc(),
              machine=_common.machine(), steps=args.steps, seed=args.seed,
              run_config=dataclasses.asdict(cfg))
  out.mkdir(parents=True, exist_ok=True)
  (out / f'{args.name}.json').write_text(
      json.dumps(dict(meta=meta, rows=rows), indent=1) + '\n')
  text = write_outputs(dict(meta=meta, rows=rows), out, args.name, compare)
  print(text)
  return rows


if __name__ == '__main__':
  main()

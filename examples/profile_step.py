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
"""Where an optimizer step's time goes, on one parameter leaf.

Companion of ``bench_step.py`` (which times whole steps on a model-shaped
tree): this script takes one ``R x C`` leaf and prints four tables.

1. **split**: the same ``optax_q.adamw`` step jitted three ways, returning
   only the new parameters (XLA then drops the state's encode), only the new
   state, or both; ``optax.adamw`` for reference. Not donated.
2. **codecs**: ``quantize`` (nearest, stochastic) and ``dequantize`` of the
   leaf alone, per format.
3. **tiles**: the donated step for ``tile_size`` from 2^14 to 2^20 and
   without tiles, with the compiled temporaries.
4. **telemetry**: the donated step with and without ``track_stalls``.

Rows of every table are measured round-robin with ``bench_step.py``'s
helpers (3 calls per row per round, after one call that compiles it), so
that machine noise hits every row alike. A single leaf's state partly fits
in a large last-level cache, so its ratios flatter those of a whole model;
quote ``bench_step.py`` for those.

Prints the tables and writes them to ``profile_step.json``, ``.md`` and
``.png`` (a bar chart per table) in ``--out`` (``profile_step_quick.*`` with
``--quick``, so that a smoke test never overwrites a full run), by default
``runs/profile_step/`` in the repository (git-ignored). The published
tables are written only when asked for, with ``--out docs/results``.
``--render`` re-writes the page and the plot from the saved JSON without
measuring (or, where only a ``profile_step.md`` of a version that wrote no
JSON is there, from that page's tables, saving them as the JSON).

Usage::

  python examples/profile_step.py                     # 2048 x 2048
  python examples/profile_step.py --quick             # 256 x 512, a smoke test
  python examples/profile_step.py --out docs/results  # the published tables
  python examples/profile_step.py --render --out docs/results  # from JSON
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

import optax_q

import _common  # pylint: disable=g-bad-import-order
import bench_step  # pylint: disable=g-bad-import-order

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FORMATS = {  # label -> (mu_format, nu_format)
    'bf16': ('bf16', 'bf16'),
    'fp8_e4m3': ('fp8_e4m3', 'fp8_e4m3'),
    'int8_dynamic': ('int8_dynamic', 'int8_dynamic'),
    'int4': ('int4', 'int4'),
    'fp4': ('fp4_e2m1', 'fp4_e2m2u'),
}


def _table(header, rows) -> dict[str, Any]:
  """One table: its header and its rows of cells, as printed."""
  return dict(header=list(header), rows=[[str(c) for c in r] for r in rows])


def _markdown_table(table) -> str:
  header = table['header']
  lines = ['| ' + ' | '.join(header) + ' |',
           '|' + '---|' + '---:|' * (len(header) - 1)]
  lines += ['| ' + ' | '.join(r) + ' |' for r in table['rows']]
  return '\n'.join(lines)


def split_table(params, grads, labels, rounds) -> dict[str, Any]:
  """Step returning params only, state only, or both (not donated)."""
  def prepared(tx, part):
    state = tx.init(params)

    def f(p, s, g):
      u, s = tx.update(g, s, p)
      new_p = optax.apply_updates(p, u)
      return {'params': new_p, 'state': s, 'both': (new_p, s)}[part]

    f = jax.jit(f)
    jax.block_until_ready(f(params, state, grads))
    return lambda: jax.block_until_ready(f(params, state, grads))

  names, fns = ['optax.adamw fp32'], [prepared(optax.adamw(1e-3), 'params')]
  for label in labels:
    mu, nu = FORMATS[label]
    for rounding in ('nearest', 'stochastic'):
      tx = optax_q.adamw(1e-3, mu_format=mu, nu_format=nu,
                         rounding=rounding)
      names.append((f'optax_q {label}', rounding))
      fns.append([prepared(tx, part) for part in ('params', 'state', 'both')])
  flat = [fn for f in fns for fn in (f if isinstance(f, list) else [f])]
  ms = iter(_round_robin_ms(flat, rounds))
  rows = [('optax.adamw fp32', '-', f'{next(ms):.2f}', '-', '-')]
  for name, rounding in names[1:]:
    rows.append((name, rounding, *(f'{next(ms):.2f}' for _ in range(3))))
  return _table(('optimizer', 'rounding', 'params only ms',
                 'state only ms', 'both ms'), rows)


def _round_robin_ms(fns, rounds) -> list[float]:
  """Median ms of each callable, measured as ``bench_step.measure`` does."""
  rows = [bench_step.Row(str(i), fn, 0, 1, 0) for i, fn in enumerate(fns)]
  for row in rows:
    row.step()  # Compile.
  bench_step.measure(rows, rounds, 3 * rounds)
  return [1e3 * statistics.median(r.times) for r in rows]


def codec_table(x, labels, rounds) -> dict[str, Any]:
  """``quantize`` (both roundings) and ``dequantize`` of ``x``, per format."""
  fmts, fns = [], []
  for label in labels:
    for fmt in dict.fromkeys(FORMATS[label]):
      # fp4_e2m2u is unsigned: a second moment's format.
      y = jnp.abs(x) if fmt == 'fp4_e2m2u' else x
      encs = [jax.jit(lambda a, fmt=fmt, r=r: optax_q.quantize(
          a, fmt, rounding=r)) for r in ('nearest', 'stochastic')]
      q = encs[0](y)
      dec = jax.jit(optax_q.dequantize)
      fmts.append(fmt)
      fns += [lambda e=e, y=y: jax.block_until_ready(e(y)) for e in encs]
      fns.append(lambda q=q, dec=dec: jax.block_until_ready(dec(q)))
  ms = iter(_round_robin_ms(fns, rounds))
  rows = [(fmt, *(f'{next(ms):.2f}' for _ in range(3))) for fmt in fmts]
  return _table(('format', 'quantize nearest ms', 'quantize stochastic ms',
                 'dequantize ms'), rows)


def round_robin(params_np, grads, configs, rounds) -> list[tuple]:
  """Donated steps of ``configs`` [(name, tx)], measured round-robin."""
  n = sum(x.size for x in params_np.values())
  rows = [bench_step.jax_row(name, tx, params_np, grads, n)
          for name, tx in configs]
  for row in rows:
    row.step()
  bench_step.measure(rows, rounds, 3 * rounds)
  base = statistics.median(rows[0].times)
  return [(r.name, f'{1e3 * statistics.median(r.times):.2f}',
           f'{statistics.median(r.times) / base:.2f}x',
           f'{r.temp_bytes / 2**20:.1f}') for r in rows]


def _quantized_adam(mu, nu, **kw):
  return optax.chain(
      optax_q.quantize_state(optax.scale_by_adam(), {'mu': mu, 'nu': nu},
                             elementwise=True, **kw),
      optax.add_decayed_weights(1e-4), optax.scale_by_learning_rate(1e-3))


def tiles_table(params_np, grads, labels, rounds) -> dict[str, Any]:
  configs = [('optax.adamw fp32', optax.adamw(1e-3, weight_decay=1e-4))]
  for label in labels:
    if label == 'bf16':
      continue  # Unscaled: never tiled.
    mu, nu = FORMATS[label]
    for log2 in (14, 16, 18, 20, None):
      tile = None if log2 is None else 2**log2
      name = f'{label}, tile_size={"None" if log2 is None else f"2^{log2}"}'
      configs.append((name, _quantized_adam(
          mu, nu, rounding='nearest', track_stalls=False, tile_size=tile)))
  return _table(('step (nearest)', 'median ms', 'ratio', 'compiled temp MiB'),
                round_robin(params_np, grads, configs, rounds))


def telemetry_table(params_np, grads, labels, rounds
                    ) -> dict[str, Any]:
  configs = [('optax.adamw fp32', optax.adamw(1e-3, weight_decay=1e-4))]
  for label in labels:
    mu, nu = FORMATS[label]
    for on in (False, True):
      configs.append((f'optax_q {label} stochastic, track_stalls={on}',
                      optax_q.adamw(1e-3, mu_format=mu, nu_format=nu,
                                    track_stalls=on)))
  return _table(('step', 'median ms', 'ratio', 'compiled temp MiB'),
                round_robin(params_np, grads, configs, rounds))


def _number(cell: str) -> float | None:
  try:
    return float(cell.rstrip('x'))
  except ValueError:
    return None


def _plot_section(ax, title, table):
  """Horizontal bars of a table's ``... ms`` columns, one group per row;
  the other numeric columns (ratio, temporaries) written at the bars."""
  header, rows = table['header'], table['rows']
  ms_cols = [i for i, h in enumerate(header) if h.endswith(' ms')]
  label_cols = [i for i, h in enumerate(header)
                if i not in ms_cols and (i == 0 or h == 'rounding')]
  note_cols = [i for i in range(len(header))
               if i not in ms_cols and i not in label_cols]
  width = 0.8 / len(ms_cols)
  # One column: a colour per group of rows (the label before its comma).
  groups = list(dict.fromkeys(row[0].split(',')[0] for row in rows))
  for k, col in enumerate(ms_cols):
    ys, xs, colors = [], [], []
    for j, row in enumerate(rows):
      value = _number(row[col])
      if value is not None:
        ys.append(j - 0.4 + width * (k + 0.5))
        xs.append(value)
        colors.append(f'C{k}' if len(ms_cols) > 1 else
                      f"C{groups.index(row[0].split(',')[0]) % 10}")
    ax.barh(ys, xs, height=width, color=colors,
            label=header[col][:-3] if len(ms_cols) > 1 else None)
  top = max(_number(r[c]) or 0.0 for r in rows for c in ms_cols)
  if note_cols:
    for j, row in enumerate(rows):
      value = max(_number(row[c]) or 0.0 for c in ms_cols)
      ax.text(value + 0.01 * top, j, ', '.join(
          f'{row[i]}' + (' MiB temp' if 'MiB' in header[i] else '')
          for i in note_cols), va='center', fontsize=6)
  ax.set_xlim(0, top * (1.3 if note_cols else 1.05))
  ax.set_yticks(range(len(rows)))
  ax.set_yticklabels([' '.join(row[i] for i in label_cols
                               if row[i] != '-') for row in rows], fontsize=6)
  ax.invert_yaxis()
  ax.set_xlabel('median ms' + (' (labels: ' + ', '.join(
      header[i] for i in note_cols) + ')' if note_cols else ''), fontsize=7)
  ax.tick_params(axis='x', labelsize=7)
  ax.set_title(title, fontsize=8)
  ax.grid(axis='x', alpha=0.3)
  if len(ms_cols) > 1:
    ax.legend(fontsize=6, loc='lower right')


def plot(result: dict[str, Any], path: str) -> str:
  """The four tables as bar charts, two columns."""
  from matplotlib.figure import Figure  # pylint: disable=g-import-not-at-top
  sections = result['sections']
  fig = Figure(figsize=(13, 10), layout='constrained')
  columns = fig.subfigures(1, 2)
  halves = (sections[:2], sections[2:])
  for sub, half in zip(columns, halves):
    if not half:
      continue
    heights = [len(sec['table']['rows'])
               * (len(sec['table']['header']) if sec['title'].startswith(
                   ('1.', '2.')) else 2) for sec in half]
    axes = sub.subplots(len(half), 1, height_ratios=heights, squeeze=False)
    for ax, sec in zip(axes[:, 0], half):
      _plot_section(ax, sec['title'], sec['table'])
  fig.suptitle(
      f"Where an optimizer step's time goes: one {result['leaf_rows']} x "
      f"{result['leaf_cols']} leaf, {'quick' if result['quick'] else 'full'}"
      f" mode; jax {result['jax']} on {result['platform']} "
      f"({result['device_kind']})", fontsize=9)
  fig.savefig(path, dpi=110)
  return path


def render_markdown(result: dict[str, Any], stem: str) -> str:
  head = (f"Command: `{result['command']}`  \n"
          f"One {result['leaf_rows']} x {result['leaf_cols']} leaf; jax "
          f"{result['jax']} on {result['platform']} "
          f"({result['device_kind']}).")
  if result.get('git_revision'):
    head += (f"  \nRevision `{result['git_revision']}`, "
             f"{result['date']}.")
  return (head + f'\n\n![median ms per row of each table]({stem}.png)\n\n'
          + '\n\n'.join(f"### {sec['title']}\n\n"
                        f"{_markdown_table(sec['table'])}"
                        for sec in result['sections']) + '\n')


def write_outputs(result: dict[str, Any], out: str, stem: str) -> str:
  """``<stem>.md`` and ``<stem>.png`` in ``out``; returns the page."""
  text = render_markdown(result, stem)
  with open(os.path.join(out, stem + '.md'), 'w') as f:
    f.write(text)
  plot(result, os.path.join(out, stem + '.png'))
  return text


def make_parser() -> argparse.ArgumentParser:
  """The flags of :func:`main`."""
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--rows', type=int, default=2048,
                      help='rows of the profiled leaf (default: %(default)s)')
  parser.add_argument('--cols', type=int, default=2048,
                      help='columns of the profiled leaf (default: %(default)s)')
  parser.add_argument('--formats', nargs='+', default=list(FORMATS),
                      choices=list(FORMATS), help='formats profiled (default: %(default)s)')
  parser.add_argument('--rounds', type=int, default=5,
                      help='round-robin rounds of the timings (default: %(default)s)')
  parser.add_argument('--quick', action='store_true',
                      help='a 256 x 512 leaf and few repetitions')
  parser.add_argument(
      '--render', action='store_true',
      help='no measurement: re-write profile_step.md and .png (with '
      '--quick: profile_step_quick.*) from the JSON in --out')
  parser.add_argument(
      '--out', default=os.path.join(_ROOT, 'runs', 'profile_step'),
      help='directory for profile_step.json, .md and .png (default: runs/profile_step; '
      'docs/results for the published tables)')
  return parser


def main(argv=None) -> str:
  """Prints the tables, writes them to ``--out`` and returns the page."""
  args = make_parser().parse_args(argv)
  stem = 'profile_step_quick' if args.quick else 'profile_step'
  json_path = os.path.join(args.out, stem + '.json')
  path = os.path.join(args.out, stem + '.md')
  if args.render:
    with open(json_path) as f:
      result = json.load(f)
    write_outputs(result, args.out, stem)
    print(f'wrote {args.out}/{stem}.{{md,png}}')
    return path
  if args.quick:
    args.rows, args.cols, args.rounds = 256, 512, 1
  rng = np.random.default_rng(0)
  shape = (args.rows, args.cols)
  params_np = {'w': rng.standard_normal(shape, dtype=np.float32) * 0.02}
  grads = {'w': jnp.asarray(rng.standard_normal(shape, dtype=np.float32)
                            * 1e-3)}
  params = jax.tree.map(jnp.asarray, params_np)
  sections = [
      ('1. Params only, state only, both (not donated, round-robin)',
       split_table(params, grads, args.formats, args.rounds)),
      ('2. Codecs alone (round-robin)',
       codec_table(grads['w'] * 1e3, args.formats, args.rounds)),
      ('3. Tile size (donated, round-robin)',
       tiles_table(params_np, grads, args.formats, args.rounds)),
      ('4. Stall telemetry (donated, round-robin)',
       telemetry_table(params_np, grads,
                       [f for f in ('bf16', 'fp8_e4m3') if f in args.formats],
                       args.rounds)),
  ]
  dev = jax.devices()[0]
  result = dict(
      command=_common.command_line(__file__, argv), quick=args.quick, leaf_rows=args.rows, leaf_cols=args.cols,
      jax=jax.__version__, platform=dev.platform,
      device_kind=dev.device_kind, git_revision=_common.git_revision(),
      date=_common.now_utc(),
      sections=[dict(title=t, table=table) for t, table in sections])
  os.makedirs(args.out, exist_ok=True)
  with open(json_path, 'w') as f:
    json.dump(result, f, indent=1)
    f.write('\n')
  text = write_outputs(result, args.out, stem)
  print(text)
  print(f'wrote {path}')
  return path


if __name__ == '__main__':
  main()

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
r"""The main job: train a small GPT with fp32, fp8 and 4-bit Adam states.

Trains the byte-level GPT of ``models/`` on the Python standard library's
own sources (no download) three times, with the same init, batches and
schedule (warm-up then cosine, clipping 1.0):

* ``fp32``: ``optax.adamw``, the reference;
* ``fp8_e4m3/sr``: ``optax_q.adamw`` with both moments in fp8 e4m3,
  block-scaled, stochastic rounding;
* ``4bit/sr``: ``optax_q.adamw`` with the first moment in fp4 e2m1 and the
  second in the zero-free unsigned e2m2 grid, packed two codes per byte.

It prints a table (final validation loss, optimizer-state bytes, bits per
state element, median step time, ratios to fp32) and writes a loss-curve
plot and metrics JSON to ``--out`` (default ``runs/demo/`` in the
repository, which git ignores)::

  python examples/demo.py
  python examples/demo.py --steps 1000 --configs fp32 int8_dynamic/sr 4bit/sr

A few minutes on two CPU cores. ``--help`` lists the model and schedule
flags; ``--data FILE`` trains on your own text.
"""

import argparse
import dataclasses
import json
import pathlib
import time

import _common  # pylint: disable=g-bad-import-order

from models import train  # pylint: disable=g-bad-import-order

DEFAULT_CONFIGS = ('fp32', 'fp8_e4m3/sr', '4bit/sr')
DEFAULTS = _common.RunConfig()

HEADER = ('optimizer', 'val loss', 'vs fp32', 'state bytes', 'vs fp32',
          'bits/elem', 'quantized', 'step ms', 'vs fp32')


def table_rows(rows):
  """Rows of the printed table; ratios are against the first row (fp32)."""
  base = rows[0]
  out = []
  for r in rows:
    gap = r['final_val_loss'] / base['final_val_loss'] - 1.0
    out.append((
        r['config'],
        f"{r['final_val_loss']:.4f}",
        f'{100 * gap:+.2f}%',
        f"{r['state_bytes']:,}",
        f"{r['state_bytes'] / base['state_bytes']:.3f}x",
        f"{r['state_bits_per_element']:.2f}",
        f"{100 * r['quantized_elements']:.1f}%",
        f"{r['step_ms_median']:.0f}",
        f"{r['step_ms_median'] / base['step_ms_median']:.2f}x",
    ))
  return out


def make_parser() -> argparse.ArgumentParser:
  """The flags of :func:`main`."""
  parser = argparse.ArgumentParser(
      description=__doc__.split('\n')[0],
      formatter_class=_common.HelpFormatter)
  _common.add_out_argument(parser, __file__)
  parser.add_argument(
      '--configs', nargs='+', default=list(DEFAULT_CONFIGS),
      help="optimizers: 'fp32' first, then <mu>[+<nu>]/<rn|sr> or 4bit/sr")
  parser.add_argument('--seed', type=int, default=0,
                      help='seed of the init, the batches and the rounding')
  parser.add_argument('--no-progress', action='store_true',
                      help='no progress bars (for logs)')
  _common.add_run_args(parser, DEFAULTS)
  return parser


def main(argv=None):
  args = make_parser().parse_args(argv)
  cfg = _common.run_config_from_args(args)
  opts = [_common.parse_config(c) for c in args.configs]
  out = pathlib.Path(args.out)
  out.mkdir(parents=True, exist_ok=True)

  t_start = time.perf_counter()
  load_start = _common.load_average()
  corpus = _common.load_corpus(cfg, args.data)
  model = _common.make_model(cfg)
  eval_fn = _common.make_eval_fn(cfg, corpus)
  print(f'corpus: {corpus.fingerprint["num_bytes"]:,} bytes '
        f'({corpus.fingerprint["source"]}, '
        f'{corpus.fingerprint["num_files"]} files); '
        f'model: {model.num_params():,} params; {cfg.steps} steps of '
        f'{cfg.batch_size}x{cfg.seq_len} tokens')

  rows, results = [], {}
  for opt in opts:
    row, result = _common.run(
        opt, cfg, corpus, seed=args.seed, model=model, eval_fn=eval_fn,
        progress=not args.no_progress,
        metrics_path=out / opt.name.replace('/', '_'))
    rows.append(row)
    results[opt.name] = result
  wall_s = time.perf_counter() - t_start

  plot = train.plot_curves(
      results, out / 'loss_curves.png',
      labels={r['config']: f"{r['config']}: state "
              f"{r['state_bytes'] / 2**20:.2f} MiB" for r in rows},
      title=f'GPT {model.num_params() / 1e6:.2f}M params, byte-level '
            f'stdlib corpus, seed {args.seed}')
  summary = dict(
      command=_common.command_line(__file__, argv),
      git_revision=_common.git_revision(),
      modified_paths=_common.git_modified_paths(),
      date=_common.now_utc(),
      machine=_common.machine(),
      load_average_at_start=load_start,
      load_average_at_end=_common.load_average(),
      wall_s=wall_s,
      run_config=dataclasses.asdict(cfg),
      corpus=corpus.fingerprint,
      rows=rows,
  )
  (out / 'metrics.json').write_text(json.dumps(summary, indent=1) + '\n')

  print()
  print(_common.text_table(HEADER, table_rows(rows)))
  print()
  quant = max(rows, key=lambda r: r['quantized_elements'])
  print(f"quantized: fraction of moment elements held in low precision; "
        f"{100 * quant['quantized_leaves']:.0f}% of the moment leaves hold "
        f"{100 * quant['quantized_elements']:.1f}% of the elements, the rest "
        f'(biases, LayerNorm) are under min_size={cfg.min_size} and stay '
        'float32.')
  print(f'wrote {plot}, {out / "metrics.json"} '
        f'(total {wall_s:.0f} s)')
  return summary


if __name__ == '__main__':
  main()

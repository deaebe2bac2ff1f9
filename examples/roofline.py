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
"""The roofline of the optimizer step: bytes moved, and the time they take.

An optimizer step does little arithmetic per byte, so on a GPU or TPU its
time is bounded below by the bytes it must move through memory once: the
gradient read, the parameter read and written, and the whole state read
and written. For each state format this script takes the state's real
layout (codes, block scales and counters of ``tx.init`` on the GPU
benchmark tree, traced with `jax.eval_shape`, so nothing is allocated),
counts those bytes per parameter, and turns them into the least time per
step for one billion parameters at a given memory bandwidth::

  python examples/roofline.py --out docs/results

Bandwidths: an H100's device-to-device copy, about 3.0 TB/s counting bytes
read and written (measured with PyTorch on the machine of our GPU runs),
and a TPU v5e's HBM, 819 GB/s (its published peak; not measured here).
Where ``docs/results/bench_step_gpu.json`` holds an H100 run on the same
tree, its measured step times are set beside the H100 bound.

Writes ``roofline.{json,md}``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import sys

import jax
import jax.numpy as jnp
import optax

import optax_q

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_step  # pylint: disable=g-import-not-at-top,wrong-import-position

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Bytes per second, read + write.
BANDWIDTHS = {'H100 (3.0 TB/s copy)': 3.0e12, 'TPU v5e (819 GB/s HBM)': 819e9}
GRAD_BYTES = 4  # float32 gradients, as in bench_step.
PARAM_BYTES = 4  # float32 parameters, read and written.


def states() -> list[tuple[str, optax.GradientTransformation]]:
  """(name, transform) per state format (the bytes do not depend on the
  rounding; optax_q's rows are bench_step's without it)."""
  q = lambda **kw: optax_q.adamw(1e-3, **kw)  # noqa: E731
  rows = [('optax.adamw fp32', optax.adamw(1e-3)),
          ('optax.adamw mu_dtype=bf16',
           optax.adamw(1e-3, mu_dtype=jnp.bfloat16))]
  for label, mu, nu in (('bf16', 'bf16', 'bf16'),
                        ('fp8_e4m3', 'fp8_e4m3', 'fp8_e4m3'),
                        ('int8_dynamic', 'int8_dynamic', 'int8_dynamic'),
                        ('fp4_e2m1/fp4_e2m2u', 'fp4_e2m1', 'fp4_e2m2u'),
                        ('int4', 'int4', 'int4'),
                        ('nf4/ue4m0', 'nf4', 'ue4m0')):
    rows.append((f'optax_q {label}', q(mu_format=mu, nu_format=nu)))
  rows.append(('optax_q nf4/int4_mulaw (recommended 4-bit)',
               q(mu_format='nf4', nu_format='int4_mulaw',
                 rounding='preconditioner')))
  rows.append(('optax_q nf3/int3_mulaw (recommended 3-bit)',
               q(mu_format='nf3', nu_format='int3_mulaw',
                 rounding='preconditioner')))
  return rows


def state_bytes(tx, params) -> int:
  """Bytes of ``tx``'s state for ``params`` (abstract), every leaf."""
  shapes = jax.eval_shape(tx.init, params)
  return sum(math.prod(s.shape) * jnp.dtype(s.dtype).itemsize
             for s in jax.tree.leaves(shapes))


def make_parser() -> argparse.ArgumentParser:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--out', default=os.path.join(_ROOT, 'runs',
                                                    'roofline'),
                      help='directory for roofline.{json,md} (default: '
                      'runs/roofline; docs/results for the published ones)')
  parser.add_argument('--d', type=int, default=1024,
                      help='model width (default: %(default)s)')
  parser.add_argument('--layers', type=int, default=24,
                      help='layers (default: %(default)s)')
  parser.add_argument('--render', action='store_true',
                      help='no measurement: re-write roofline.md from the '
                      'roofline.json in --out')
  return parser


def main(argv=None) -> dict:
  parser = make_parser()
  args = parser.parse_args(argv)
  if args.d < 1 or args.layers < 1:
    parser.error(f'--d and --layers must be positive integers, got '
                 f'{args.d} and {args.layers}')
  if args.render:
    with open(os.path.join(args.out, 'roofline.json')) as f:
      result = json.load(f)
    with open(os.path.join(args.out, 'roofline.md'), 'w') as f:
      f.write(render(result))
    return result
  shapes = bench_step.param_shapes(args.d, args.layers)
  params = {k: jax.ShapeDtypeStruct(s, jnp.float32)
            for k, s in shapes.items()}
  n = sum(math.prod(s) for s in shapes.values())
  measured = {}
  gpu_file = os.path.join(_ROOT, 'docs', 'results', 'bench_step_gpu.json')
  if os.path.exists(gpu_file):
    with open(gpu_file) as f:
      gpu = json.load(f)
    # The bound beside a measured step is the H100's: only an H100 run's
    # steps are set beside it.
    if ((gpu['d'], gpu['layers']) == (args.d, args.layers)
        and 'H100' in gpu['machine']):
      for r in gpu['rows']:
        key = ' '.join(w for w in r['config'].split()
                       if w not in ('nearest', 'stochastic'))
        measured.setdefault(key, {})[r['config']] = r['step_ms_median']
  rows = []
  for name, tx in states():
    per_param = state_bytes(tx, params) / n
    moved = GRAD_BYTES + 2 * PARAM_BYTES + 2 * per_param
    row = dict(config=name, state_bytes_per_param=round(per_param, 4),
               moved_bytes_per_param=round(moved, 4),
               ms_per_billion={k: round(moved * 1e9 / bw * 1e3, 3)
                               for k, bw in BANDWIDTHS.items()})
    if name in measured:
      bound = moved * n / BANDWIDTHS['H100 (3.0 TB/s copy)'] * 1e3
      row['gpu_measured_ms'] = measured[name]
      row['gpu_bound_ms'] = round(bound, 3)
    rows.append(row)
    print(f'{name:60s} {per_param:6.3f} B state, {moved:6.2f} B moved',
          flush=True)
  result = dict(
      command='python examples/roofline.py ' + ' '.join(
          sys.argv[1:] if argv is None else argv),
      git_revision=bench_step.git_revision(),
      date=datetime.datetime.now(datetime.timezone.utc).strftime(
          '%Y-%m-%dT%H:%M:%SZ'),
      machine=bench_step.machine_line(), d=args.d, layers=args.layers,
      params=n, grad_bytes=GRAD_BYTES, param_bytes=PARAM_BYTES,
      bandwidths=BANDWIDTHS,
      measured_on=(gpu['machine'] if measured else None),
      measured_revision=(gpu['git_revision'] if measured else None),
      measured_copy_gbps=(gpu['copy_gbps'] if measured else None),
      rows=rows)
  os.makedirs(args.out, exist_ok=True)
  with open(os.path.join(args.out, 'roofline.json'), 'w') as f:
    json.dump(result, f, indent=2)
    f.write('\n')
  with open(os.path.join(args.out, 'roofline.md'), 'w') as f:
    f.write(render(result))
  return result


def render(result: dict) -> str:
  """The Markdown page of a roofline result."""
  names = list(result['bandwidths'])
  lines = [
      f"Command: `{result['command']}`  ",
      f"Revision {result['git_revision']}, {result['date']}; the GPU "
      f"benchmark tree (d={result['d']}, {result['layers']} layers, "
      f"{result['params'] / 1e6:.1f}M parameters), states traced, not "
      'allocated.  ',
      f"Bytes moved per parameter and step: the gradient read "
      f"({result['grad_bytes']} B), the parameter read and written "
      f"(2 x {result['param_bytes']} B), the state read and written.",
      '',
      '| state | state B/param | moved B/param | '
      + ' | '.join(f'ms per 1B params, {k}' for k in names)
      + ' | measured on the GPU tree | its bound at 3.0 TB/s |',
      '|---|---:|---:|' + '---:|' * len(names) + '---:|---:|']
  for r in result['rows']:
    gpu = ('<br>'.join(f'{ms:.2f} ms ({c})'
                       for c, ms in r['gpu_measured_ms'].items())
           + f" | {r['gpu_bound_ms']:.2f} ms"
           if 'gpu_measured_ms' in r else '- | -')
    lines.append(
        f"| {r['config']} | {r['state_bytes_per_param']:.3f} | "
        f"{r['moved_bytes_per_param']:.2f} | "
        + ' | '.join(f"{r['ms_per_billion'][k]:.2f}" for k in names)
        + f' | {gpu} |')
  if result.get('measured_on'):
    lines += ['', f"Measured: {result['measured_on']}, revision "
              f"{result['measured_revision']} "
              '([bench_step_gpu](bench_step_gpu.md)).']
  return '\n'.join(lines) + '\n'


if __name__ == '__main__':
  main()

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
"""How long the first ``tx.init`` takes, optax_q next to ``optax.adamw``.

The parameter tree is `bench_step`'s (a transformer's matrices, biases and
norms; d=512 and 8 layers: 25M parameters). Each init runs in a fresh
interpreter, so that nothing is compiled or cached before it; the time is
measured around the first ``tx.init(params)`` alone (until its state is
ready), the parameters already on the device. The optimizers alternate so
that a change in the machine's load falls on all of them. Prints the median
of each and its ratio to ``optax.adamw``'s (target: at most 5).

    python examples/init_time.py --runs 5
"""

from collections.abc import Sequence
import argparse
import pathlib
import statistics

import import_time  # pylint: disable=g-bad-import-order

ROOT = pathlib.Path(__file__).resolve().parents[1]

OPTIMIZERS = {
    'optax.adamw': 'optax.adamw(1e-3)',
    'optax_q.adamw fp8': "optax_q.adamw(1e-3, mu_format='fp8_e4m3', "
                         "nu_format='fp8_e4m3')",
    'optax_q.adamw int8_dynamic': 'optax_q.adamw(1e-3)',
    'optax_q.adamw int4': "optax_q.adamw(1e-3, mu_format='int4', "
                          "nu_format='int4')",
}

_TIMED = '''
import sys, time
sys.path.insert(0, {examples!r})
import jax, jax.numpy as jnp, optax, optax_q
import bench_step
params = jax.tree.map(jnp.asarray, bench_step.host_arrays(
    bench_step.param_shapes({d}, {layers}), 0))
jax.block_until_ready(params)
tx = {make}
t = time.perf_counter()
jax.block_until_ready(tx.init(params))
print(time.perf_counter() - t)
'''


def init_seconds(make: str, d: int, layers: int) -> float:
  """Seconds of the first ``tx.init`` in a fresh interpreter."""
  return import_time.fresh_seconds(_TIMED.format(
      examples=str(ROOT / 'examples'), make=make, d=d, layers=layers))


def make_parser() -> argparse.ArgumentParser:
  parser = argparse.ArgumentParser(
      description=__doc__.split('\n\n', maxsplit=1)[0],
      formatter_class=argparse.ArgumentDefaultsHelpFormatter)
  parser.add_argument('--runs', type=int, default=5,
                      help='fresh interpreters per optimizer')
  parser.add_argument('--d', type=int, default=512, help='model width')
  parser.add_argument('--layers', type=int, default=8, help='layers')
  return parser


def main(argv: Sequence[str] | None = None) -> dict[str, float]:
  args = make_parser().parse_args(argv)
  if args.runs < 1:
    raise SystemExit(f'--runs must be at least 1, got {args.runs}')
  times = {name: [] for name in OPTIMIZERS}
  for _ in range(args.runs):
    for name, make in OPTIMIZERS.items():
      times[name].append(init_seconds(make, args.d, args.layers))
  medians = {n: statistics.median(t) for n, t in times.items()}
  base = medians['optax.adamw']
  for name, got in times.items():
    print(f'{name:28s} median {medians[name]:.3f} s  '
          f'{medians[name] / base:5.1f}x  '
          f'(runs: {", ".join(f"{t:.3f}" for t in got)})')
  print('target: the first optax_q init at most 5x the first optax.adamw '
        'init')
  return medians


if __name__ == '__main__':
  main()

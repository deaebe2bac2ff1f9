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
"""How long ``import optax_q`` takes next to ``import optax``.

Each import runs in a fresh interpreter (nothing cached in ``sys.modules``),
the two alternating so that a change in the machine's load falls on both;
the time is measured inside the interpreter around the ``import`` statement
alone (interpreter start-up excluded). Prints the median of each and their
ratio; the target is ``import optax_q`` at most 2x ``import optax`` (it
imports optax, jax and numpy, and neither Flax nor SciPy: ``optax_q.quant``
loads them when first used).

    python examples/import_time.py --runs 7
"""

from collections.abc import Sequence
import argparse
import os
import pathlib
import statistics
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]

_TIMED = ('import time\n'
          't = time.perf_counter()\n'
          'import {module}\n'
          'print(time.perf_counter() - t)\n')


def fresh_seconds(code: str) -> float:
  """The last number ``code`` prints, run in a fresh interpreter with this
  checkout's optax_q first on ``sys.path`` (installed or not)."""
  env = dict(os.environ)
  env['PYTHONPATH'] = os.pathsep.join(
      p for p in (str(ROOT), env.get('PYTHONPATH')) if p)
  out = subprocess.run([sys.executable, '-c', code], env=env, cwd=ROOT,
                       capture_output=True, text=True, check=True)
  return float(out.stdout.split()[-1])


def import_seconds(module: str) -> float:
  """Seconds to import ``module`` in a fresh interpreter."""
  return fresh_seconds(_TIMED.format(module=module))


def make_parser() -> argparse.ArgumentParser:
  parser = argparse.ArgumentParser(
      description=__doc__.split('\n\n', maxsplit=1)[0],
      formatter_class=argparse.ArgumentDefaultsHelpFormatter)
  parser.add_argument('--runs', type=int, default=5,
                      help='fresh interpreters per module')
  return parser


def main(argv: Sequence[str] | None = None) -> None:
  args = make_parser().parse_args(argv)
  if args.runs < 1:
    raise SystemExit(f'--runs must be at least 1, got {args.runs}')
  times = {'optax': [], 'optax_q': []}
  import_seconds('optax_q')  # Warm the file cache; not counted.
  for _ in range(args.runs):
    for module, got in times.items():
      got.append(import_seconds(module))
  medians = {m: statistics.median(t) for m, t in times.items()}
  for module, got in times.items():
    print(f'import {module:8s} median {medians[module]:.3f} s  '
          f'(runs: {", ".join(f"{t:.3f}" for t in got)})')
  print(f'ratio optax_q / optax: {medians["optax_q"] / medians["optax"]:.2f}'
        ' (target: at most 2)')


if __name__ == '__main__':
  main()

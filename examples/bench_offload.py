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
"""Host offload of the optimizer state: what a step costs, and its bytes.

The parameter tree of ``bench_step.py`` (per layer the four matrices of a
transformer block, their biases and norms), AdamW with its moments in
float32, 8 bits and 4 bits. For each, two jitted steps side by side: the
state kept in device memory, and the state kept in host memory
(``state_shardings(..., memory_kind='pinned_host')``) and moved to the
device for the update inside the compiled step (``jax.device_put`` to the
device-side shardings), then back. Round-robin over several rounds, median
step time of each.

The bytes the offloaded step moves are the state's real bytes
(``optax_q.state_nbytes``) in and again out; the time they would take over
a PCIe gen5 x16 link is computed from its specification (about 64 GB/s per
direction), not measured. On a CPU, host and device memory are the same
RAM: the measured difference is what the memory-kind annotations cost here,
not a transfer over a bus.

Writes ``bench_offload.json`` to ``--out`` (by default ``runs/bench_offload``
in the repository, git-ignored; ``--out docs/results`` for the published
numbers).

Usage::

  python examples/bench_offload.py                  # d=512, 4 layers
  python examples/bench_offload.py --out docs/results
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import statistics
import sys

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
import optax

import optax_q

import _common  # pylint: disable=g-bad-import-order
import bench_step  # pylint: disable=g-bad-import-order

# PCIe gen5 x16: 32 GT/s x 16 lanes, 128b/130b encoding, about 63 GB/s per
# direction (a specification figure; measured links reach less).
PCIE_GEN5_X16_BYTES_PER_S = 64e9

FORMATS = {'fp32': 'fp32', 'int8': 'int8', '4-bit': 'int4'}


def _optimizer(fmt: str) -> optax.GradientTransformation:
  return optax_q.adamw(1e-3, mu_format=fmt, nu_format=fmt, min_size=0)


def offload_row(name: str, tx, params, grads, *, offload: bool
                ) -> bench_step.Row:
  """A donated, jitted step; with ``offload`` its state in host memory."""
  mesh = jax.make_mesh((1,), ('data',))
  param_shardings = jax.tree.map(lambda _: NamedSharding(mesh, P()), params)
  abstract = jax.eval_shape(tx.init, params)  # NumPy params, copied below.
  on_device = optax_q.state_shardings(abstract, param_shardings)
  stored = on_device
  if offload:
    stored = optax_q.state_shardings(abstract, param_shardings,
                                     memory_kind='pinned_host')

  def step(p, state, g):
    state = jax.device_put(state, on_device)  # Host to device, if offloaded.
    updates, state = tx.update(g, state, p)
    return optax.apply_updates(p, updates), jax.device_put(state, stored)

  step = jax.jit(step, in_shardings=(param_shardings, stored,
                                     param_shardings),
                 out_shardings=(param_shardings, stored),
                 donate_argnums=(0, 1))
  p = jax.device_put(params, param_shardings)
  state = jax.jit(tx.init, out_shardings=stored)(p)
  kinds = sorted({x.sharding.memory_kind for x in jax.tree.leaves(state)})
  holder = {'p': p, 'state': state}

  def run():
    out = step(holder['p'], holder['state'], grads)
    jax.block_until_ready(out)
    holder['p'], holder['state'] = out

  n = sum(x.size for x in jax.tree.leaves(params))
  row = bench_step.Row(name, run, optax_q.state_nbytes(state), 2 * n, n)
  row.memory_kinds = kinds
  return row


def make_parser() -> argparse.ArgumentParser:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                   formatter_class=_common.HelpFormatter)
  parser.add_argument('--d', type=int, default=512, help='model width')
  parser.add_argument('--layers', type=int, default=4,
                      help='transformer layers of the benchmark tree')
  parser.add_argument('--rounds', type=int, default=5,
                      help='rounds over the rows, each taking its share '
                      'of --steps')
  parser.add_argument('--steps', type=int, default=20,
                      help='measured steps per row, over all rounds')
  parser.add_argument('--out', default=os.path.join(
      bench_step._ROOT, 'runs', 'bench_offload'),  # pylint: disable=protected-access
                      help='output directory (default: runs/bench_offload; '
                      'docs/results for the published results)')
  return parser


def main(argv=None) -> dict:
  args = make_parser().parse_args(argv)
  shapes = bench_step.param_shapes(args.d, args.layers)
  n = sum(math.prod(s) for s in shapes.values())
  params = bench_step.host_arrays(shapes, 0)  # Each row copies them.
  grads = jax.tree.map(jnp.asarray, bench_step.host_arrays(shapes, 1))
  print(f'{n / 1e6:.2f}M params; {jax.devices()[0]}', flush=True)
  rows = []
  for label, fmt in FORMATS.items():
    for offload in (False, True):
      name = f'{label} state, {"offloaded" if offload else "on device"}'
      rows.append(offload_row(name, _optimizer(fmt), params, grads,
                              offload=offload))
      rows[-1].step()  # Compile, and one warm-up step.
      rows[-1].step()
  bench_step.measure(rows, args.rounds, args.steps)
  out_rows = []
  for row in rows:
    ms = 1e3 * statistics.median(row.times)
    moved = 2 * row.state_bytes if 'offloaded' in row.name else 0
    out_rows.append(dict(
        config=row.name, step_ms_median=round(ms, 3),
        state_bytes=row.state_bytes, memory_kinds=row.memory_kinds,
        bytes_moved_per_step=moved,
        pcie_gen5_x16_ms_per_direction=round(
            1e3 * row.state_bytes / PCIE_GEN5_X16_BYTES_PER_S, 4),
        steps=len(row.times)))
    print(f'  {row.name:30s} {ms:8.2f} ms  state {row.state_bytes / 2**20:7.2f}'
          f' MiB  {row.memory_kinds}', flush=True)
  result = dict(
      command=' '.join(['python examples/bench_offload.py'] + list(
          sys.argv[1:] if argv is None else argv)),
      git_revision=bench_step.git_revision(),
      date=datetime.datetime.now(datetime.timezone.utc).strftime(
          '%Y-%m-%dT%H:%M:%SZ'),
      machine=bench_step.machine_line(),
      versions=bench_step.package_versions(),
      d=args.d, layers=args.layers, params=n, rounds=args.rounds,
      pcie_gen5_x16_bytes_per_s=PCIE_GEN5_X16_BYTES_PER_S,
      pcie_note='specification figure, not measured',
      rows=out_rows)
  os.makedirs(args.out, exist_ok=True)
  with open(os.path.join(args.out, 'bench_offload.json'), 'w') as f:
    json.dump(result, f, indent=2)
    f.write('\n')
  return result


if __name__ == '__main__':
  main()

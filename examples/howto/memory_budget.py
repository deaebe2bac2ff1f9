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
"""How-to: choose state formats for a memory budget, without allocating.

``jax.eval_shape(tx.init, params)`` gives the state's abstract buffers and
``optax_q.state_nbytes`` their real bytes (4- and 3-bit codes packed, scales
included), so candidate configurations can be compared before any memory
is used. This script lists candidates by stored bits, most first, and picks
the first that fits.

Every candidate was measured; the comments on ``CANDIDATES`` name the
result files under ``docs/results/``. In short: on the precision study's
small GPT the 8-bit states with stochastic rounding end within about half
a percent of float32 AdamW's loss (fp8 once just past it), and their
updates follow float32 AdamW's closely (update cosine about 0.996,
``docs/results/fidelity.md``). The smallest candidates are the recommended
4- and 3-bit states, chosen on fidelity to float32 AdamW
(``nf4`` + ``int4_mulaw`` and ``nf3`` + ``int3_mulaw``, the second moment
rounded in preconditioner space): the 4-bit one stays close to float32's
steps, the 3-bit one departs more. ``int4`` on both moments is not offered:
it was the worst 4-bit pair measured. These are small models and short
runs; check the pick on your own with ``optax_q.track_fidelity``.

Run: ``python examples/howto/memory_budget.py --budget-mib 60``.
"""

import argparse
import sys

import jax
import jax.numpy as jnp
import optax_q

# By stored bits, most first: (label, adamw keyword arguments). optax_q.adamw
# rounds stochastically by default, as the measured runs did.
CANDIDATES = (
    ('fp32', dict(mu_format='fp32', nu_format='fp32')),
    # bf16/sr was +0.66% against float32 in docs/results/precision_full.md:
    # not closer to float32 than the 8-bit rows below, at twice their bytes.
    ('bf16', dict(mu_format='bf16', nu_format='bf16')),
    # fp8_e4m3/sr: -0.22%, -0.23% and +0.56% against float32 in three runs
    # (docs/results/precision_full.md, precision_seeds_floor.md,
    # precision_layouts.md). The library's default int8_dynamic, same bytes,
    # was steadier (+0.12% and +0.18%, precision_full.md and
    # precision_seeds_floor.md) but its step is slower
    # (docs/results/bench_step.md): use it where the loss matters more.
    ('fp8', dict(mu_format='fp8_e4m3', nu_format='fp8_e4m3')),
    # 4-bit first moment, 8-bit second: 0.99x float32's loss in the
    # teacher-student runs of docs/results/lowbit.md.
    ('nf4 mu, int8_dynamic nu', dict(mu_format='nf4',
                                     nu_format='int8_dynamic')),
    # The recommended 4-bit state (recommended_4bit in
    # docs/results/fidelity.md): on the teacher-student problem, steps
    # within 2% of float32's in norm and a learning-rate window nearly as
    # wide; on the classifier and the GPT closer to float32's steps than
    # plain stochastic rounding. Loss-based studies had preferred power-of-two
    # scales (docs/results/lowbit.md), which enlarge the steps instead.
    ('nf4 + int4_mulaw', dict(mu_format='nf4', nu_format='int4_mulaw',
                              rounding='preconditioner')),
    # The recommended 3-bit state (recommended_3bit in
    # docs/results/fidelity.md): further from float32's steps (update cosine
    # 0.7-0.9 on the three problems).
    ('nf3 + int3_mulaw', dict(mu_format='nf3', nu_format='int3_mulaw',
                              rounding='preconditioner')),
)


def model_params(width: int, layers: int):
  """Abstract parameters of an MLP stack: no memory is allocated."""
  sds = jax.ShapeDtypeStruct
  params = {}
  for i in range(layers):
    params[f'layer{i}'] = {'kernel': sds((width, 4 * width), jnp.float32),
                           'out': sds((4 * width, width), jnp.float32),
                           'bias': sds((width,), jnp.float32)}
  return params


def state_mib(params, **formats) -> float:
  tx = optax_q.adamw(1e-3, **formats)
  return optax_q.state_nbytes(jax.eval_shape(tx.init, params)) / 2**20


def make_parser() -> argparse.ArgumentParser:
  """The flags of :func:`main`."""
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--budget-mib', type=float, default=60.0,
                      help='optimizer-state budget in MiB (default: 60)')
  parser.add_argument('--width', type=int, default=512,
                      help='model width (default: 512)')
  parser.add_argument('--layers', type=int, default=8,
                      help='layers (default: 8)')
  return parser


def main(argv=None) -> bool:
  args = make_parser().parse_args(argv)
  params = model_params(args.width, args.layers)
  n = sum(x.size for x in jax.tree.leaves(params))
  chosen = None
  for label, formats in CANDIDATES:
    mib = state_mib(params, **formats)
    fits = mib <= args.budget_mib
    print(f'{label:30s} {mib:7.1f} MiB  {8 * mib * 2**20 / n:5.2f} bits/param'
          f'  {"fits" if fits else "over budget"}')
    if fits and chosen is None:
      chosen = label
  print(f'{n / 1e6:.1f}M parameters, budget {args.budget_mib} MiB: '
        f'{chosen or "nothing fits"}')
  if chosen is not None:
    formats = dict(CANDIDATES)[chosen]
    kwargs = ', '.join(f'{k}={v!r}' for k, v in formats.items())
    print(f'  optax_q.adamw(learning_rate, {kwargs})')
  return chosen is not None


if __name__ == '__main__':
  sys.exit(0 if main() else 1)

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
``optax_q.state_nbytes`` their real bytes (4-bit codes packed, scales
included), so candidate configurations can be compared before any memory
is used. This script lists candidates by stored bits, most first, and picks
the first that fits. Their measured losses are in the precision study (fp8
and int8_dynamic with stochastic rounding match float32 AdamW on the small
GPT; 4-bit states cost loss there).

Run: ``python examples/howto/memory_budget.py --budget-mib 60``.
"""

import argparse
import sys

import jax
import jax.numpy as jnp
import optax_q

# By stored bits, most first: (label, adamw keyword arguments).
CANDIDATES = (
    ('fp32', dict(mu_format='fp32', nu_format='fp32')),
    ('bf16', dict(mu_format='bf16', nu_format='bf16')),
    ('fp8', dict(mu_format='fp8_e4m3', nu_format='fp8_e4m3')),
    ('int4 mu, int8_dynamic nu', dict(mu_format='int4',
                                      nu_format='int8_dynamic')),
    ('int4', dict(mu_format='int4', nu_format='int4')),
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


def main(argv=None) -> bool:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--budget-mib', type=float, default=60.0,
                      help='optimizer-state budget in MiB (default: 60)')
  parser.add_argument('--width', type=int, default=512,
                      help='model width (default: 512)')
  parser.add_argument('--layers', type=int, default=8,
                      help='layers (default: 8)')
  args = parser.parse_args(argv)
  params = model_params(args.width, args.layers)
  n = sum(x.size for x in jax.tree.leaves(params))
  chosen = None
  for label, formats in CANDIDATES:
    mib = state_mib(params, **formats)
    fits = mib <= args.budget_mib
    print(f'{label:28s} {mib:8.1f} MiB  {8 * mib * 2**20 / n:5.2f} bits/param'
          f'  {"fits" if fits else "over budget"}')
    if fits and chosen is None:
      chosen = label
  print(f'{n / 1e6:.1f}M parameters, budget {args.budget_mib} MiB: '
        f'{chosen or "nothing fits"}')
  return chosen is not None


if __name__ == '__main__':
  sys.exit(0 if main() else 1)

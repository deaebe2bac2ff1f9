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
"""How-to: split the optimizer state over the data-parallel axis (ZeRO-1).

The parameters stay replicated over the ``'data'`` axis of the mesh;
``optax_q.state_shardings(..., shard_over='data')`` splits every quantized
state buffer over it too, in whole blocks, so each device keeps a share of
the state between steps. Jit ``init`` and the step with these shardings;
the run equals an unsharded one bit for bit (AdamW; see the how-to page for
the exceptions), and each device holds a ``1/n`` share of the state.

Run on CPU with 8 simulated devices:
``python examples/howto/zero_state.py`` (the script sets the XLA flag when
it is run as a script; exits 1 if the runs differ).
"""

import os
import sys

if __name__ == '__main__':
  os.environ.setdefault('XLA_FLAGS',
                        '--xla_force_host_platform_device_count=8')

# pylint: disable=g-import-not-at-top,wrong-import-position
import argparse  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402
from jax.sharding import NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402
import optax_q  # noqa: E402


def make_parser() -> argparse.ArgumentParser:
  """The flags of :func:`main`."""
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--steps', type=int, default=3,
                      help='steps of each run (default: 3)')
  return parser


def main(argv=None) -> bool:
  args = make_parser().parse_args(argv)
  n = jax.device_count()
  mesh = jax.make_mesh((n,), ('data',))
  params = {'w': jnp.linspace(-1.0, 1.0, 64 * 1024).reshape(64, 1024),
            'b': jnp.zeros((1024,))}
  replicated = {k: NamedSharding(mesh, P()) for k in params}
  tx = optax_q.adamw(1e-3, mu_format='fp8_e4m3', nu_format='int4',
                     min_size=0, block_size=32)
  shardings = optax_q.state_shardings(jax.eval_shape(tx.init, params),
                                      replicated, shard_over='data')

  def step(p, state, i):
    g = jax.tree.map(lambda x: jnp.sin(3.0 * x + i), p)  # A replicated grad.
    updates, state = tx.update(g, state, p)
    return optax.apply_updates(p, updates), state

  zero_step = jax.jit(step, in_shardings=(replicated, shardings, None),
                      out_shardings=(replicated, shardings))
  p = jax.device_put(params, replicated)
  state = jax.jit(tx.init, out_shardings=shardings)(p)
  want_p, want_state = params, tx.init(params)
  plain_step = jax.jit(step)
  for i in range(args.steps):
    p, state = zero_step(p, state, i)
    want_p, want_state = plain_step(want_p, want_state, i)
  same = all(np.array_equal(a, b) for a, b in zip(
      jax.tree.leaves((p, state)), jax.tree.leaves((want_p, want_state))))
  per_device = sum(x.addressable_shards[0].data.nbytes
                   for x in jax.tree.leaves(state))
  total = optax_q.state_nbytes(state)
  mu = state[0].inner_state.mu['w']
  print(f'{n} devices; mu codes {mu.codes.sharding.spec}, scales '
        f'{mu.scale.sharding.spec}; state bytes per device {per_device} of '
        f'{total}; ZeRO-1 run bit-identical: {same}')
  return same and per_device * n <= total + 8 * n


if __name__ == '__main__':
  sys.exit(0 if main() else 1)

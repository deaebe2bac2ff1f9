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
"""How-to: formats per parameter, and hyperparameters injected by schedule.

1. Per parameter, with ``optax.partition``: 4-bit moments for the large
   kernels, float32 Adam for the rest.
2. Per state leaf, with a path function: ``quantize_state(inner,
   formats=fn)``, where ``fn(path, leaf)`` returns a format or None.
3. ``optax.inject_hyperparams(optax_q.adamw)``: no ``static_args`` needed
   (the layout arguments default to None, which it leaves static); pass
   ``hyperparam_dtype=jnp.float32`` so that bf16 parameters do not turn
   ``b2=0.999`` into 1.0.

Run: ``python examples/howto/formats_and_schedules.py``.
"""

import argparse
import sys

import jax
import jax.numpy as jnp
import optax
import optax_q


def params():
  keys = jax.random.split(jax.random.key(0), 3)
  return {'embed': jax.random.normal(keys[0], (512, 64)) * 0.02,
          'kernel': jax.random.normal(keys[1], (64, 256)) * 0.02,
          'bias': jnp.zeros((256,))}


def per_parameter() -> optax.GradientTransformation:
  labels = {'embed': 'plain', 'kernel': 'quantized', 'bias': 'plain'}
  return optax.partition(
      {'quantized': optax_q.adamw(1e-3, mu_format='int4', nu_format='int4',
                                  min_size=0),
       'plain': optax.adamw(1e-3)}, labels)


def per_leaf() -> optax.GradientTransformation:
  def fmt(path: str, leaf) -> str | None:
    # path is the leaf's 'a/b/c' name in the inner state, e.g. 'mu/kernel'.
    if path.endswith('bias'):
      return None  # Stays float32.
    return 'fp8_e4m3' if path.startswith('mu') else 'int8_dynamic'
  return optax.chain(
      optax_q.quantize_state(optax.scale_by_adam(), fmt, min_size=0,
                             elementwise=True),
      optax.scale_by_learning_rate(1e-3))


def injected(steps: int) -> optax.GradientTransformation:
  schedule = optax.linear_schedule(1e-3, 0.0, steps)
  return optax.inject_hyperparams(optax_q.adamw, hyperparam_dtype=jnp.float32)(
      learning_rate=schedule, weight_decay=0.01)


def run(tx, p, steps):
  state = tx.init(p)

  @jax.jit
  def step(p, state, i):
    g = jax.tree.map(lambda x: jnp.cos(x + i), p)
    updates, state = tx.update(g, state, p)
    return optax.apply_updates(p, updates), state

  for i in range(steps):
    p, state = step(p, state, i)
  return p, state


def make_parser() -> argparse.ArgumentParser:
  """The flags of :func:`main`."""
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--steps', type=int, default=5,
                      help='steps of each run (default: 5)')
  return parser


def main(argv=None) -> bool:
  args = make_parser().parse_args(argv)
  p = params()
  ok = True
  for name, tx in (('partition', per_parameter()), ('path function',
                                                    per_leaf()),
                   ('inject_hyperparams', injected(args.steps))):
    new_p, state = run(tx, p, args.steps)
    leaves = optax_q.quantized_leaves(state)
    print(f'{name}: state {optax_q.state_nbytes(state)} bytes; quantized: '
          + ', '.join(f'{k} ({q.fmt.name})' for k, q in leaves.items()))
    ok &= all(bool(jnp.all(jnp.isfinite(x))) for x in jax.tree.leaves(new_p))
  lr = float(state.hyperparams['learning_rate'])
  print(f'injected learning rate after {args.steps} steps: {lr:.2e}')
  return ok


if __name__ == '__main__':
  sys.exit(0 if main() else 1)

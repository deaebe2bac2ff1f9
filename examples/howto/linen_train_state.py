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
"""How-to: a Flax Linen ``TrainState`` loop with quantized optimizer state,
a learning-rate schedule, an Orbax checkpoint and a bit-identical resume.

The optimizer is a drop-in: ``optax_q.adamw`` where ``optax.adamw`` was. The
checkpoint target is ``jax.eval_shape`` of the function that builds the
``TrainState``, so its quantized leaves (``QArray``: codes and scales) are
restored with their layout.

Run: ``python examples/howto/linen_train_state.py`` (exits 1 if the resumed
run differs from the straight one).
"""

import argparse
import sys
import tempfile

from flax import linen as nn
from flax.training import train_state
import jax
import jax.numpy as jnp
import numpy as np
import optax
import optax_q
import orbax.checkpoint as ocp


class MLP(nn.Module):

  @nn.compact
  def __call__(self, x):
    return nn.Dense(1)(nn.relu(nn.Dense(256)(x)))


def create_state(steps: int) -> train_state.TrainState:
  """Parameters and an AdamW with int8 moments, on a warm-up-cosine schedule."""
  model = MLP()
  params = model.init(jax.random.key(0), jnp.zeros((1, 16)))['params']
  schedule = optax.warmup_cosine_decay_schedule(
      0.0, 1e-3, warmup_steps=steps // 10, decay_steps=steps)
  tx = optax_q.adamw(schedule, weight_decay=0.01)  # int8_dynamic moments.
  return train_state.TrainState.create(
      apply_fn=model.apply, params=params, tx=tx)


def batch(step: int):
  key = jax.random.fold_in(jax.random.key(1), step)
  x = jax.random.normal(key, (64, 16))
  return x, jnp.sin(x.sum(axis=1, keepdims=True))


@jax.jit
def train_step(state, x, y):
  def loss_fn(params):
    return jnp.mean((state.apply_fn({'params': params}, x) - y) ** 2)
  loss, grads = jax.value_and_grad(loss_fn)(state.params)
  return state.apply_gradients(grads=grads), loss


def train(state, start: int, stop: int):
  loss = jnp.nan
  for step in range(start, stop):
    state, loss = train_step(state, *batch(step))
  return state, float(loss)


def make_parser() -> argparse.ArgumentParser:
  """The flags of :func:`main`."""
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--steps', type=int, default=40,
                      help='steps in all (default: 40)')
  parser.add_argument('--save-at', type=int, default=20,
                      help='step of the checkpoint (default: 20)')
  return parser


def main(argv=None) -> bool:
  args = make_parser().parse_args(argv)

  state, _ = train(create_state(args.steps), 0, args.save_at)
  with tempfile.TemporaryDirectory() as tmp:
    path = f'{tmp}/ckpt'
    with ocp.StandardCheckpointer() as ckptr:
      ckptr.save(path, state)
    abstract = jax.eval_shape(lambda: create_state(args.steps))
    with ocp.StandardCheckpointer() as ckptr:
      resumed = ckptr.restore(path, abstract)
  # apply_fn and tx are not arrays: take them from a fresh state.
  resumed = create_state(args.steps).replace(
      step=resumed.step, params=resumed.params, opt_state=resumed.opt_state)

  straight, loss = train(state, args.save_at, args.steps)
  resumed, loss2 = train(resumed, args.save_at, args.steps)
  same = all(np.array_equal(a, b) for a, b in zip(
      jax.tree.leaves((straight.params, straight.opt_state)),
      jax.tree.leaves((resumed.params, resumed.opt_state))))
  print(f'loss {loss:.6f} straight, {loss2:.6f} resumed; optimizer state '
        f'{optax_q.state_nbytes(straight.opt_state)} bytes (fp32 AdamW: '
        f'{optax_q.state_nbytes(optax.adamw(1e-3).init(straight.params))}); '
        f'resumed run bit-identical: {same}')
  return same


if __name__ == '__main__':
  sys.exit(0 if main() else 1)

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
"""How-to: a Flax NNX training loop with quantized optimizer state, saved
with Orbax and resumed bit for bit.

Save ``nnx.state((model, optimizer))`` and restore it into the abstract state
of a freshly built model and optimizer (``nnx.eval_shape`` of the same
constructor), then ``nnx.update`` them. Restoring into
``jax.eval_shape(tx.init, params)`` does not work with NNX: the optimizer's
state is an ``nnx.State`` whose paths are not those of the raw Optax state.

Run: ``python examples/howto/nnx_checkpoint.py`` (prints the check; exits 1
if the resumed run differs from the straight one).
"""

import argparse
import sys
import tempfile

from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np
import optax_q
import orbax.checkpoint as ocp


class MLP(nnx.Module):

  def __init__(self, rngs: nnx.Rngs):
    self.hidden = nnx.Linear(16, 256, rngs=rngs)
    self.out = nnx.Linear(256, 1, rngs=rngs)

  def __call__(self, x):
    return self.out(nnx.relu(self.hidden(x)))


def make():
  """A model and its optimizer: AdamW with fp8 moments (kernels >= 4096)."""
  model = MLP(nnx.Rngs(0))
  tx = optax_q.adamw(1e-3, mu_format='fp8_e4m3', nu_format='fp8_e4m3')
  return model, nnx.Optimizer(model, tx, wrt=nnx.Param)


def batch(step: int):
  key = jax.random.fold_in(jax.random.key(1), step)
  x = jax.random.normal(key, (64, 16))
  return x, jnp.sin(x.sum(axis=1, keepdims=True))


@nnx.jit
def train_step(model, optimizer, x, y):
  loss, grads = nnx.value_and_grad(
      lambda m: jnp.mean((m(x) - y) ** 2))(model)
  optimizer.update(model, grads)
  return loss


def train(model, optimizer, start: int, stop: int) -> float:
  loss = jnp.nan
  for step in range(start, stop):
    loss = train_step(model, optimizer, *batch(step))
  return float(loss)


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

  model, optimizer = make()
  train(model, optimizer, 0, args.save_at)
  with tempfile.TemporaryDirectory() as tmp:
    path = f'{tmp}/ckpt'
    with ocp.StandardCheckpointer() as ckptr:
      ckptr.save(path, nnx.state((model, optimizer)))
    # A fresh model and optimizer, built abstractly, give the target.
    abstract = nnx.state(nnx.eval_shape(make))
    with ocp.StandardCheckpointer() as ckptr:
      restored = ckptr.restore(path, abstract)
  model2, optimizer2 = make()
  nnx.update((model2, optimizer2), restored)

  loss = train(model, optimizer, args.save_at, args.steps)
  loss2 = train(model2, optimizer2, args.save_at, args.steps)
  same = all(
      np.array_equal(a, b) for a, b in zip(
          jax.tree.leaves(nnx.state((model, optimizer))),
          jax.tree.leaves(nnx.state((model2, optimizer2)))))
  print(f'loss {loss:.6f} straight, {loss2:.6f} resumed; state bytes '
        f'{optax_q.state_nbytes(nnx.state(optimizer))}; resumed run '
        f'bit-identical: {same}')
  return same


if __name__ == '__main__':
  sys.exit(0 if main() else 1)

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
"""How-to: a Flax NNX loop with adaptive bit-widths, re-laid out between
steps, saved with Orbax and resumed bit for bit, formats included.

AdamW with ``optax_q.adaptive_bits`` around its moments keeps each moment
leaf in 3, 4 or 8 bits and decides inside the compiled step when a leaf
should move;
``optax_q.relayout`` applies the decisions between steps. In NNX the new
state is put back as the optimizer wraps a state
(``nnx.data(to_opt_state(new))``): assigning it directly would update the
old ``QArray``s in place, and their formats are part of their type.

A checkpoint holds the state and its layout (``optax_q.bit_layout``, a small
JSON dict). To restore, build the model and optimizer, ``relayout`` their
state to the saved layout, take the abstract state of that
(``nnx.eval_shape``) as the target, and ``nnx.update`` a fresh model and
optimizer with what Orbax returns.

Run: ``python examples/howto/nnx_adaptive_bits.py`` (prints the check;
exits 1 if the resumed run differs from the straight one).
"""

import argparse
import sys
import tempfile

from flax import nnx
from flax.nnx.training import optimizer as nnx_optimizer
import jax
import jax.numpy as jnp
import numpy as np
import optax
import optax_q
import orbax.checkpoint as ocp


class MLP(nnx.Module):

  def __init__(self, rngs: nnx.Rngs):
    self.hidden = nnx.Linear(16, 256, rngs=rngs)
    self.mid = nnx.Linear(256, 256, rngs=rngs)
    self.out = nnx.Linear(256, 1, rngs=rngs)

  def __call__(self, x):
    return self.out(nnx.relu(self.mid(nnx.relu(self.hidden(x)))))


def relayout(optimizer: nnx.Optimizer, layout=None, *, step=None) -> bool:
  """Re-encodes the optimizer's state in place; True if a format changed."""
  new = optax_q.relayout(optimizer.opt_state, layout, step=step)
  if new is optimizer.opt_state:
    return False
  optimizer.opt_state = nnx.data(nnx_optimizer.to_opt_state(new))
  return True


def make(layout=None):
  """A model and its optimizer: AdamW with adaptive bits (kernels >= 4096
  elements), deciding every 2 steps so that this short run sees a change;
  with ``layout``, its state in those formats."""
  model = MLP(nnx.Rngs(0))
  tx = optax.chain(
      optax_q.adaptive_bits(optax.scale_by_adam(), period=2, patience=1,
                            elementwise=True),
      optax.add_decayed_weights(1e-4),
      optax.scale_by_learning_rate(1e-3))
  optimizer = nnx.Optimizer(model, tx, wrt=nnx.Param)
  if layout is not None:
    relayout(optimizer, layout)
  return model, optimizer


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
    # Outside jit; returns at once except every period * patience steps.
    if relayout(optimizer, step=step + 1):
      bits = optax_q.state_bits_per_element(optimizer.opt_state)
      print(f'step {step + 1}: new layout, {bits:.2f} bits per element')
  return float(loss)


def make_parser() -> argparse.ArgumentParser:
  """The flags of :func:`main`."""
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--steps', type=int, default=12,
                      help='steps in all (default: 12)')
  parser.add_argument('--save-at', type=int, default=6,
                      help='step of the checkpoint (default: 6)')
  return parser


def main(argv=None) -> bool:
  args = make_parser().parse_args(argv)

  model, optimizer = make()
  start = optax_q.bit_layout(optimizer.opt_state)
  train(model, optimizer, 0, args.save_at)
  layout = optax_q.bit_layout(optimizer.opt_state)
  print(f'layout at step {args.save_at}, {len(layout)} leaves; changed '
        f'since step 0: {layout != start}')
  with tempfile.TemporaryDirectory() as tmp:
    with ocp.CheckpointManager(tmp) as mgr:
      mgr.save(args.save_at, args=ocp.args.Composite(
          state=ocp.args.StandardSave(nnx.state((model, optimizer))),
          layout=ocp.args.JsonSave(layout)))
      mgr.wait_until_finished()
    with ocp.CheckpointManager(tmp) as mgr:
      saved = mgr.restore(args.save_at, args=ocp.args.Composite(
          layout=ocp.args.JsonRestore()))['layout']
      # The target: a fresh model and optimizer in the saved formats.
      target = nnx.state(nnx.eval_shape(lambda: make(saved)))
      restored = mgr.restore(args.save_at, args=ocp.args.Composite(
          state=ocp.args.StandardRestore(target)))['state']
  model2, optimizer2 = make(saved)
  nnx.update((model2, optimizer2), restored)

  loss = train(model, optimizer, args.save_at, args.steps)
  loss2 = train(model2, optimizer2, args.save_at, args.steps)
  same = optax_q.bit_layout(optimizer.opt_state) == optax_q.bit_layout(
      optimizer2.opt_state) and all(
          np.array_equal(a, b) for a, b in zip(
              jax.tree.leaves(nnx.state((model, optimizer))),
              jax.tree.leaves(nnx.state((model2, optimizer2)))))
  print(f'loss {loss:.6f} straight, {loss2:.6f} resumed; resumed run '
        f'bit-identical, formats included: {same}')
  return same


if __name__ == '__main__':
  sys.exit(0 if main() else 1)

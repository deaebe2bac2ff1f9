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
"""How-to: move a run from plain Optax to optax_q and back, switching
precision in the middle, with Orbax checkpoints.

1. Train with ``optax.adamw`` and save an ordinary Orbax checkpoint.
2. Restore it into the plain optimizer's abstract state and resume under
   ``optax_q.adamw`` with 8-bit moments: ``optax_q.from_optax`` encodes the
   moments and keeps the step count. The loss goes on as it would under
   Optax.
3. Switch precision mid-run: ``optax_q.to_optax`` decodes the 8-bit state,
   and ``from_optax`` encodes it for AdamW with ``optax_q.adaptive_bits``
   (3 to 8 bits per leaf, chosen as training goes). Save that state with
   its layout (``optax_q.bit_layout``, JSON) and resume from it bit for
   bit, formats included.
4. Go back: ``to_optax`` gives the plain ``optax.adamw`` state again.

Run: ``python examples/howto/migrate_optax.py`` (prints the checks; exits
1 if one fails).
"""

import argparse
import sys
import tempfile

import jax
import jax.numpy as jnp
import numpy as np
import optax
import optax_q
import orbax.checkpoint as ocp

LEARNING_RATE = 3e-3


def init_params():
  k1, k2, k3 = jax.random.split(jax.random.key(0), 3)
  return {'w1': jax.random.normal(k1, (16, 256)) * 0.25,
          'w2': jax.random.normal(k2, (256, 256)) * 0.06,
          'w3': jax.random.normal(k3, (256, 1)) * 0.06}


def loss_fn(params, step):
  x = jax.random.normal(jax.random.fold_in(jax.random.key(1), step), (64, 16))
  y = jnp.sin(x.sum(axis=1, keepdims=True))
  h = jax.nn.relu(jax.nn.relu(x @ params['w1']) @ params['w2'])
  return jnp.mean((h @ params['w3'] - y) ** 2)


def train(tx, params, state, start, stop, relayout=False):
  """Steps ``start`` to ``stop``: the params, the state and the losses."""

  @jax.jit
  def step(params, state, i):
    loss, grads = jax.value_and_grad(loss_fn)(params, i)
    updates, state = tx.update(grads, state, params)
    return optax.apply_updates(params, updates), state, loss

  losses = []
  for i in range(start, stop):
    params, state, loss = step(params, state, i)
    losses.append(float(loss))
    if relayout:  # Between steps: apply the adaptive-bits decisions.
      state = optax_q.relayout(state, step=i + 1)
  return params, state, losses


def adaptive_adamw():
  """AdamW (the chain of ``optax.adamw``) with adaptive bits, deciding every
  2 steps so that a short run sees a change."""
  return optax.chain(
      optax_q.adaptive_bits(optax.scale_by_adam(), period=2, patience=1,
                            elementwise=True),
      optax.add_decayed_weights(1e-4),
      optax.scale_by_learning_rate(LEARNING_RATE))


def make_parser() -> argparse.ArgumentParser:
  """The flags of :func:`main`."""
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--steps', type=int, default=10,
                      help='steps of each phase (default: 10)')
  return parser


def main(argv=None) -> bool:
  args = make_parser().parse_args(argv)
  n = args.steps
  plain_tx = optax.adamw(LEARNING_RATE)
  tx8 = optax_q.adamw(LEARNING_RATE, mu_format='int8',
                      nu_format='int8_dynamic')
  checks = {}

  # 1. Plain Optax, saved by Orbax as any run would be.
  params = init_params()
  params, plain, _ = train(plain_tx, params, plain_tx.init(params), 0, n)
  with tempfile.TemporaryDirectory() as tmp:
    with ocp.StandardCheckpointer() as ckptr:
      ckptr.save(f'{tmp}/plain', {'params': params, 'opt_state': plain})
    # 2. Restore into the plain optimizer's abstract state; resume at 8 bits.
    abstract = jax.eval_shape(
        lambda: {'params': params, 'opt_state': plain_tx.init(params)})
    with ocp.StandardCheckpointer() as ckptr:
      restored = ckptr.restore(f'{tmp}/plain', abstract)
  params = restored['params']
  state8 = optax_q.from_optax(restored['opt_state'], tx8, params)
  print(f'resumed at step {int(state8[0].inner_state.count)}, '
        f'{optax_q.state_nbytes(state8)} state bytes (plain: '
        f'{optax_q.state_nbytes(plain)})')
  _, _, expected = train(plain_tx, params, restored['opt_state'], n, 2 * n)
  params, state8, got = train(tx8, params, state8, n, 2 * n)
  print('optax   ', ' '.join(f'{x:.4f}' for x in expected))
  print('optax_q ', ' '.join(f'{x:.4f}' for x in got))
  checks['loss continues under optax_q'] = bool(
      np.allclose(got, expected, rtol=0.02))

  # 3. Switch precision mid-run: 8 bits -> adaptive bits, saved with its
  # layout and resumed.
  tx = adaptive_adamw()
  state = optax_q.from_optax(optax_q.to_optax(state8), tx, params)
  params, state, _ = train(tx, params, state, 2 * n, 3 * n, relayout=True)
  layout = optax_q.bit_layout(state)
  print('layout:', sorted(set(layout.values())))
  with tempfile.TemporaryDirectory() as tmp:
    with ocp.CheckpointManager(tmp) as mgr:
      mgr.save(3 * n, args=ocp.args.Composite(
          state=ocp.args.StandardSave({'params': params, 'opt_state': state}),
          layout=ocp.args.JsonSave(layout)))
      mgr.wait_until_finished()
    with ocp.CheckpointManager(tmp) as mgr:
      saved = mgr.restore(3 * n, args=ocp.args.Composite(
          layout=ocp.args.JsonRestore()))['layout']
      target = {'params': jax.eval_shape(lambda: params),
                'opt_state': optax_q.relayout(
                    jax.eval_shape(tx.init, params), saved)}
      restored = mgr.restore(3 * n, args=ocp.args.Composite(
          state=ocp.args.StandardRestore(target)))['state']
  straight = train(tx, params, state, 3 * n, 4 * n, relayout=True)
  resumed = train(tx, restored['params'], restored['opt_state'], 3 * n,
                  4 * n, relayout=True)
  checks['resumed bit-identical, formats included'] = (
      optax_q.bit_layout(straight[1]) == optax_q.bit_layout(resumed[1])
      and all(np.array_equal(a, b) for a, b in zip(
          jax.tree.leaves(straight[:2]), jax.tree.leaves(resumed[:2]))))

  # 4. Back to plain Optax.
  params, state = straight[:2]
  back = optax_q.to_optax(state)
  same_tree = jax.tree.structure(back) == jax.tree.structure(plain)
  _, _, plain_losses = train(plain_tx, params, back, 4 * n, 5 * n)
  _, _, q_losses = train(tx, params, state, 4 * n, 5 * n, relayout=True)
  checks['back in optax.adamw'] = same_tree and bool(
      np.allclose(plain_losses, q_losses, rtol=0.02))
  for name, ok in checks.items():
    print(f'{name}: {ok}')
  return all(checks.values())


if __name__ == '__main__':
  sys.exit(0 if main() else 1)

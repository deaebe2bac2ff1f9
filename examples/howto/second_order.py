"""How-to: Shampoo and SOAP with 8-bit, resettable state.

``optax_q.shampoo`` and ``optax_q.soap`` keep every statistic in its own
format: the moments, the factor statistics (held in their eigenbasis, one
scale per row) and the eigenbases (rounded to nearest, rectified on use);
the 8-bit defaults take about a quarter of the float32 state. Here an MLP
trains with AdamW, 8-bit Shampoo and 8-bit SOAP with resets (moments to
zero, statistics to a scaled identity); the state's real bytes are
printed, and an Orbax round trip of SOAP's state resumes bit-identically.

Run: ``python examples/howto/second_order.py --steps 60``.
"""

import argparse
import tempfile

from flax import linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import optax_q
import orbax.checkpoint as ocp


class MLP(nn.Module):

  @nn.compact
  def __call__(self, x):
    for i in range(2):
      x = nn.gelu(nn.Dense(128, name=f'fc_{i}')(x))
    return nn.Dense(10, name='head')(x)


def batch(step):
  """A fixed random teacher's labels for fresh inputs at every step."""
  x = jax.random.normal(jax.random.fold_in(jax.random.key(1), step),
                        (64, 32))
  teacher = jax.random.normal(jax.random.key(2), (32, 10))
  return x, jnp.argmax(jnp.tanh(x @ teacher), axis=-1)


def make_step(model, tx):
  def loss_fn(p, step):
    x, y = batch(step)
    logits = model.apply({'params': p}, x)
    return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()

  @jax.jit
  def step_fn(p, s, step):
    loss, g = jax.value_and_grad(loss_fn)(p, step)
    u, s = tx.update(g, s, p)
    return optax.apply_updates(p, u), s, loss

  return step_fn


def train(step_fn, params, state, start, stop):
  loss = None
  for step in range(start, stop):
    params, state, loss = step_fn(params, state, step)
  return params, state, float(loss)


def make_parser() -> argparse.ArgumentParser:
  """The flags of :func:`main`."""
  parser = argparse.ArgumentParser(description=__doc__)
  parser.add_argument('--steps', type=int, default=60,
                      help='steps of each run; the checkpoint is taken '
                      'halfway (default: 60)')
  return parser


def main(argv=None) -> bool:
  args = make_parser().parse_args(argv)
  model = MLP()
  params = jax.jit(model.init)(jax.random.key(0),
                               jnp.zeros((1, 32)))['params']
  optimizers = {
      'adamw fp32': optax.adamw(3e-3),
      'shampoo 8-bit': optax_q.shampoo(3e-3, max_preconditioner_dim=64,
                                       min_size=0),
      'soap 8-bit + resets': optax_q.soap(3e-3, b2=0.99,
                                          max_preconditioner_dim=64,
                                          min_size=0, reset_every=40),
  }
  ok = True
  steps = {name: make_step(model, tx) for name, tx in optimizers.items()}
  for name, tx in optimizers.items():
    _, state, loss = train(steps[name], params, tx.init(params), 0,
                           args.steps)
    print(f'{name:20s} loss {loss:.4f}, state '
          f'{optax_q.state_nbytes(state) / 1024:.1f} KiB')
    ok &= bool(np.isfinite(loss))
  # Checkpoint SOAP's quantized, resetting state halfway; resume.
  tx = optimizers['soap 8-bit + resets']
  step_fn = steps['soap 8-bit + resets']  # Compiled once, above.
  half = args.steps // 2
  p, s, _ = train(step_fn, params, tx.init(params), 0, half)
  with tempfile.TemporaryDirectory() as tmp, ocp.StandardCheckpointer() as c:
    c.save(f'{tmp}/ckpt', {'params': p, 'state': s})
    c.wait_until_finished()
    restored = c.restore(f'{tmp}/ckpt', {
        'params': p, 'state': jax.eval_shape(tx.init, params)})
  resumed = train(step_fn, restored['params'], restored['state'], half,
                  args.steps)[0]
  straight = train(step_fn, params, tx.init(params), 0, args.steps)[0]
  same = all(np.array_equal(a, b) for a, b in
             zip(jax.tree.leaves(resumed), jax.tree.leaves(straight)))
  print(f'resumed run bit-identical: {same}')
  return ok and same


if __name__ == '__main__':
  raise SystemExit(0 if main() else 1)

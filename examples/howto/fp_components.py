"""How-to: quantize gradients, forward weights and moments independently.

``optax_q.quantized_training`` sets the four components of Tang et al.'s
framework: gradients (``g``), the weights the forward pass sees (``w``;
the float32 master weights stay with the optimizer), and the stored first
(``m``) and second (``v``) moments. ``q.optimizer(tx)`` puts
``optax_q.quantize_gradients`` first and wraps ``tx`` in
``optax_q.quantize_state``; ``q.weights(params, step)`` gives the forward
weights with a straight-through gradient. Here an MLP trains with Muon
(its auxiliary Adam quantized too) and with AdamW, in fp8 gradients and
weights and ``e{E}m{M}`` moments; with float32 formats (``e8m23``) the run
is float32's, bit for bit. Last, ``optax_q.muon`` keeps Muon's momentum in
8 bits (real bytes).

Run: ``python examples/howto/fp_components.py --steps 50``.
"""

import argparse
import sys

from flax import linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import optax_q


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


def train(model, params, tx, q, steps):
  """Trains; ``q`` (or None) gives the forward weights. Returns the params
  and the losses."""
  def loss_fn(p, step):
    x, y = batch(step)
    w = p if q is None else q.weights(p, step)
    logits = model.apply({'params': w}, x)
    return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()

  @jax.jit
  def step_fn(p, s, step):
    loss, g = jax.value_and_grad(loss_fn)(p, step)
    u, s = tx.update(g, s, p)
    return optax.apply_updates(p, u), s, loss

  state, losses = tx.init(params), []
  for step in range(steps):
    params, state, loss = step_fn(params, state, step)
    losses.append(float(loss))
  return params, state, losses


def make_parser() -> argparse.ArgumentParser:
  """The flags of :func:`main`."""
  parser = argparse.ArgumentParser(description=__doc__)
  parser.add_argument('--steps', type=int, default=50,
                      help='training steps of each run (default: 50)')
  return parser


def main(argv=None) -> bool:
  args = make_parser().parse_args(argv)
  model = MLP()
  params = jax.jit(model.init)(jax.random.key(0),
                               jnp.zeros((1, 32)))['params']
  ok = True
  for name, make in (('muon', lambda: optax.contrib.muon(0.02)),
                     ('adamw', lambda: optax.adamw(3e-3))):
    # fp8 gradients (e5m2, block scales) and forward weights (e4m3, row
    # scales), a first moment with a 3-bit mantissa and a bf16-like second
    # moment (e8m{M}: float32's exponent range, no scales).
    q = optax_q.quantized_training(
        {'g': 'e5m2', 'w': 'e4m3', 'm': 'e8m3', 'v': 'e8m7'})
    _, _, fp32 = train(model, params, make(), None, args.steps)
    _, _, quant = train(model, params, q.optimizer(make()), q, args.steps)
    print(f'{name}: loss {fp32[0]:.3f} -> float32 {fp32[-1]:.3f}, '
          f'quantized {quant[-1]:.3f}')
    ok &= quant[-1] < quant[0]
  # Float32 formats: every component rounds to float32, i.e. not at all.
  q32 = optax_q.quantized_training('e8m23')
  make = lambda: optax.contrib.muon(0.02)  # noqa: E731
  got, _, _ = train(model, params, q32.optimizer(make()), q32, 5)
  want, _, _ = train(model, params, make(), None, 5)
  same = all(np.array_equal(a, b) for a, b in
             zip(jax.tree.leaves(got), jax.tree.leaves(want)))
  print(f'muon with e8m23 everywhere equals float32 bit-identical: {same}')
  ok &= same
  # 8-bit Muon: linear int8 momentum in blocks of 2048 (min_size=0 so
  # this small model's kernels count).
  tx = optax_q.muon(0.02, min_size=0)
  _, state, losses = train(model, params, tx, None, args.steps)
  bits = optax_q.state_bits_per_element(state)
  print(f'8-bit muon: loss {losses[-1]:.3f}, {bits:.2f} bits per state '
        'element')
  return bool(ok and losses[-1] < losses[0] and bits < 9)


if __name__ == '__main__':
  sys.exit(0 if main() else 1)

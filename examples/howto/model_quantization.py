"""How-to: quantize a trained Flax model (PTQ), train it quantized (QAT),
and measure what the optimizer did to it.

``optax_q.quant`` quantizes every linear layer of a Flax Linen model
without rewriting it: ``quant.ptq(4)`` evaluates it with 4-bit weights and
activations (round to nearest, per row and per token), ``quant.qat(4)``
trains it with QuEST's 4-bit fake quantization (Hadamard rotation,
Gaussian-optimal clipping, trust-mask straight-through gradient). Here a
small MLP is trained with AdamW and with Muon; for each, the validation loss
before and after PTQ, the outlier metrics of the linear layers' inputs, the
output error ``R_L`` and the error decomposition ``R = A + B + C`` of each
layer are printed; then the MLP is trained again under QAT. With QAT
switched off (``enabled=False``) the model is the plain one, bit for bit.

Run: ``python examples/howto/model_quantization.py --steps 300``.
"""

import argparse

from flax import linen as nn
import jax
import jax.numpy as jnp
import optax
from optax_q import quant


class MLP(nn.Module):

  @nn.compact
  def __call__(self, x):
    for i in range(3):
      x = nn.gelu(nn.Dense(128, use_bias=False, name=f'fc_{i}')(x))
    return nn.Dense(10, use_bias=False, name='head')(x)


def batch(step):
  """A fixed random teacher's labels for fresh inputs at every step."""
  x = jax.random.normal(jax.random.fold_in(jax.random.key(1), step),
                        (128, 64))
  teacher = jax.random.normal(jax.random.key(2), (64, 10))
  return x, jnp.argmax(jnp.tanh(x @ teacher) + 0.1 * x[:, :10], axis=-1)


def loss_fn(model, params, data, quantization=None):
  apply = model.apply if quantization is None else quantization(model.apply)
  x, y = data
  logits = apply({'params': params}, x)
  return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()


def train(model, tx, steps, quantization=None):
  params = model.init(jax.random.key(0), jnp.zeros((1, 64)))['params']
  state = tx.init(params)

  @jax.jit
  def step_fn(p, s, t):
    grads = jax.grad(lambda p: loss_fn(model, p, batch(t), quantization))(p)
    updates, s = tx.update(grads, s, p)
    return optax.apply_updates(p, updates), s

  for t in range(steps):
    params, state = step_fn(params, state, t)
  return params


def optimizer(name, steps):
  lr = optax.cosine_decay_schedule(3e-3 if name == 'adamw' else 2e-2, steps)
  if name == 'adamw':
    return optax.adamw(lr, weight_decay=0.1)
  return optax.contrib.muon(lr, adam_learning_rate=3e-3)


def make_parser() -> argparse.ArgumentParser:
  """The flags of :func:`main`."""
  parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
  parser.add_argument('--steps', type=int, default=300,
                      help='training steps of each model, float32 and '
                      'QAT (default: 300)')
  return parser


def main(argv=None):
  args = make_parser().parse_args(argv)
  model = MLP()
  val = batch(10**6)
  apply = lambda p, x: model.apply({'params': p}, x)
  ok = True
  for name in ('adamw', 'muon'):
    params = train(model, optimizer(name, args.steps), args.steps)
    fp = float(loss_fn(model, params, val))
    w4a4 = float(loss_fn(model, params, val, quant.ptq(4)))
    _, inputs = quant.linear_inputs(apply)(params, val[0])
    mmr = sum(float(quant.max_to_median(h)) for h in inputs.values())
    kurt = sum(float(quant.kurtosis(h)) for h in inputs.values())
    out, out_q, errors, gains = jax.jit(
        quant.layer_errors(apply, quant.ptq(4)))(params, val[0])
    print(f'{name}: val loss {fp:.4f}, W4A4 PTQ {w4a4:.4f}; '
          f'MMR {mmr / len(inputs):.2f}, kurtosis {kurt / len(inputs):.2f}, '
          f'R_L {float(quant.relative_error(out, out_q)):.4f}')
    for layer, e in errors.items():
      print(f'  {layer:5s} R_in {float(e.r_in):.4f} R {float(e.r):.4f} = '
            f'A {float(e.a):.4f} + B {float(e.b):.4f} + C {float(e.c):.4f}; '
            f'gain {float(gains[layer].gain):.2f}')
      ok &= abs(float(e.a + e.b + e.c - e.r)) <= 1e-4 * float(e.r) + 1e-9
    qat = train(model, optimizer(name, args.steps), args.steps, quant.qat(4))
    print(f'  QAT (QuEST W4A4) val loss '
          f'{float(loss_fn(model, qat, val, quant.qat(4))):.4f}')
  # With QAT switched off the model and its gradient are the plain ones.
  off = quant.qat(4, enabled=False)
  same = jax.grad(lambda p: loss_fn(model, p, val, off))(params)
  plain = jax.grad(lambda p: loss_fn(model, p, val))(params)
  identical = all(bool(jnp.array_equal(a, b)) for a, b in zip(
      jax.tree.leaves(same), jax.tree.leaves(plain)))
  print(f'A + B + C = R at every layer: {ok}; QAT off is the plain model, '
        f'bit-identical: {identical}')
  return ok and identical


if __name__ == '__main__':
  main()

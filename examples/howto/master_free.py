"""How-to: train with fp8 weights and no master copy (ECO), and resume.

A small MLP's hidden kernels are stored in fp8 (row-wise scales):
``optax_q.quantize_params`` replaces them with ``QArray`` s and the float32
copy is dropped. ``optax_q.eco`` wraps AdamW (built with
``optax.inject_hyperparams`` so that it can read the learning rate of
every step), quantizes the new weights after each step with stochastic
rounding and feeds the rounding error back into the first moment;
``optax_q.quantize_state`` around it keeps the moments in 8 and 4 bits.
The step decodes the weights for the forward pass, inside ``jit``, and
``optax_q.apply_updates`` writes the new ones. The run is saved with
Orbax halfway, restored into abstract buffers, and resumed: it continues
bit-identically.

Run: ``python examples/howto/master_free.py --steps 20 --save-at 10``.
"""

import argparse
import sys
import tempfile

from flax import linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import optax_q
import orbax.checkpoint as ocp


class MLP(nn.Module):
  """Hidden layers ``fc_*`` (quantized by default), a float ``head``."""

  @nn.compact
  def __call__(self, x):
    for i in range(3):
      x = nn.gelu(nn.Dense(256, name=f'fc_{i}')(x))
    return nn.Dense(10, name='head')(x)


def batch(step: int):
  """A fixed random teacher's labels for fresh inputs at every step."""
  x = jax.random.normal(jax.random.fold_in(jax.random.key(1), step),
                        (64, 32))
  teacher = jax.random.normal(jax.random.key(2), (32, 10))
  return x, jnp.argmax(jnp.tanh(x @ teacher), axis=-1)


def loss_fn(model, params, xy):
  x, y = xy
  logits = model.apply({'params': params}, x)
  return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()


def make_optimizer():
  schedule = optax.warmup_cosine_decay_schedule(
      init_value=3e-5, peak_value=3e-3, warmup_steps=5, decay_steps=100,
      end_value=3e-4)
  adamw = optax.inject_hyperparams(optax.adamw, static_args=('mask',))(
      schedule, weight_decay=0.1,
      mask=lambda p: jax.tree.map(lambda x: x.ndim >= 2, p))
  eco = optax_q.eco(adamw, weight_format='fp8_e4m3', rounding='stochastic')
  return optax.chain(
      optax.clip_by_global_norm(1.0),
      optax_q.quantize_state(eco, {'mu': 'int8_dynamic', 'nu': 'ue4m0'},
                             scale_mode='block_pow2'))


def make_parser() -> argparse.ArgumentParser:
  """The flags of :func:`main`."""
  parser = argparse.ArgumentParser(description=__doc__)
  parser.add_argument('--steps', type=int, default=20,
                      help='steps in all (default: 20)')
  parser.add_argument('--save-at', type=int, default=10,
                      help='step of the checkpoint, which is resumed '
                      '(default: 10)')
  return parser


def main(argv=None) -> bool:
  args = make_parser().parse_args(argv)

  model = MLP()
  params = jax.jit(model.init)(jax.random.key(0),
                               jnp.zeros((1, 32)))['params']
  n_params = sum(x.size for x in jax.tree.leaves(params))
  qparams = optax_q.quantize_params(params, 'fp8_e4m3')  # Kernels in fp8.
  del params  # No float32 master copy is kept.
  tx = make_optimizer()

  @jax.jit
  def step(qparams, state, batch):
    loss, grads = jax.value_and_grad(loss_fn, argnums=1)(
        model, optax_q.dequantize_params(qparams), batch)
    updates, state = tx.update(grads, state, qparams)
    return optax_q.apply_updates(qparams, updates), state, loss

  def run(qparams, state, start, stop):
    loss = None
    for i in range(start, stop):
      qparams, state, loss = step(qparams, state, batch(i))
    return qparams, state, loss

  state = tx.init(qparams)
  whole, whole_state, loss = run(qparams, state, 0, args.steps)
  nbytes = optax_q.state_nbytes(whole) + optax_q.state_nbytes(whole_state)
  print(f'loss after {args.steps} steps: {float(loss):.4f}')
  print(f'static bytes per parameter: {nbytes / n_params:.2f} '
        '(float32 AdamW: 12)')
  print('quantized kernels:', len(optax_q.quantized_leaves(whole)))

  half, half_state, _ = run(qparams, state, 0, args.save_at)
  with tempfile.TemporaryDirectory() as tmp:
    with ocp.StandardCheckpointer() as ckptr:
      ckptr.save(f'{tmp}/ckpt', {'params': half, 'opt_state': half_state})
    # Abstract targets: the quantized layout of the parameters and the
    # state, from eval_shape (no buffers allocated).
    abstract = {'params': jax.eval_shape(lambda: qparams),
                'opt_state': jax.eval_shape(tx.init, qparams)}
    with ocp.StandardCheckpointer() as ckptr:
      restored = ckptr.restore(f'{tmp}/ckpt', abstract)
  resumed, resumed_state, _ = run(restored['params'], restored['opt_state'],
                                  args.save_at, args.steps)
  same = all(
      np.array_equal(np.asarray(a).reshape(-1).view(np.uint8),
                     np.asarray(b).reshape(-1).view(np.uint8))
      for a, b in zip(jax.tree.leaves((resumed, resumed_state)),
                      jax.tree.leaves((whole, whole_state))))
  print(f'resumed run bit-identical: {same}')
  return bool(same and np.isfinite(float(loss)))


if __name__ == '__main__':
  sys.exit(0 if main() else 1)

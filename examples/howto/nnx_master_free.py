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
"""How-to: a Flax NNX model trained without master weights (ECO), saved with
Orbax and resumed bit for bit.

The model is split into its graph and its parameters (``nnx.split``);
``optax_q.quantize_params`` stores the kernels in fp8 with no float32 copy,
and each step merges the dequantized parameters back into a model
(``nnx.merge``) for the forward pass. ``optax_q.eco`` around AdamW (built
with ``optax.inject_hyperparams``, so that eco reads the learning rate)
feeds the kernels' rounding error back into the first moment, and
``optax_q.apply_updates`` writes the new kernels. ``nnx.Optimizer`` is not
used: its update applies float updates to the model in place.

Which parameters are quantized: ``optax_q.is_linear_kernel``, the default
filter, takes the kernels of rank 2 or more and skips layers by name: any
enclosing module named ``head``, ``lm_head``, ``logits``, ``output`` or
``unembed``, or whose name contains ``embed``. Here ``hidden`` and ``mid``
are quantized and ``head`` stays float32; name your layers accordingly, or
pass ``filter=`` to ``quantize_params``.

Run: ``python examples/howto/nnx_master_free.py`` (prints the check; exits
1 if the resumed run differs from the straight one).
"""

import argparse
import sys
import tempfile

from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np
import optax
import optax_q
import orbax.checkpoint as ocp


class MLP(nnx.Module):
  """Hidden layers (quantized by default) and a float ``head``."""

  def __init__(self, rngs: nnx.Rngs):
    self.hidden = nnx.Linear(32, 256, rngs=rngs)
    self.mid = nnx.Linear(256, 256, rngs=rngs)
    self.head = nnx.Linear(256, 10, rngs=rngs)

  def __call__(self, x):
    return self.head(nnx.gelu(self.mid(nnx.gelu(self.hidden(x)))))


def batch(step: int):
  """A fixed random teacher's labels for fresh inputs at every step."""
  x = jax.random.normal(jax.random.fold_in(jax.random.key(1), step),
                        (64, 32))
  teacher = jax.random.normal(jax.random.key(2), (32, 10))
  return x, jnp.argmax(jnp.tanh(x @ teacher), axis=-1)


def make_optimizer():
  adamw = optax.inject_hyperparams(optax.adamw)(3e-3, weight_decay=0.1)
  return optax_q.eco(adamw, weight_format='fp8_e4m3', rounding='stochastic')


def make_parser() -> argparse.ArgumentParser:
  """The flags of :func:`main`."""
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--steps', type=int, default=20,
                      help='steps in all (default: 20)')
  parser.add_argument('--save-at', type=int, default=10,
                      help='step of the checkpoint (default: 10)')
  return parser


def main(argv=None) -> bool:
  args = make_parser().parse_args(argv)

  graphdef, params = nnx.split(MLP(nnx.Rngs(0)), nnx.Param)
  qparams = optax_q.quantize_params(params, 'fp8_e4m3')
  del params  # No float32 master copy is kept.
  quantized = sorted(optax_q.quantized_leaves(qparams))
  tx = make_optimizer()

  def loss_fn(params, xy):
    x, y = xy
    logits = nnx.merge(graphdef, params)(x)
    return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()

  @jax.jit
  def step(qparams, state, xy):
    loss, grads = jax.value_and_grad(loss_fn)(
        optax_q.dequantize_params(qparams), xy)
    updates, state = tx.update(grads, state, qparams)
    return optax_q.apply_updates(qparams, updates), state, loss

  def run(qparams, state, start, stop):
    loss = jnp.nan
    for i in range(start, stop):
      qparams, state, loss = step(qparams, state, batch(i))
    return qparams, state, float(loss)

  state = tx.init(qparams)
  whole, whole_state, loss = run(qparams, state, 0, args.steps)
  print(f'quantized: {quantized}; loss after {args.steps} steps: {loss:.4f}')

  half, half_state, _ = run(qparams, state, 0, args.save_at)
  with tempfile.TemporaryDirectory() as tmp:
    with ocp.StandardCheckpointer() as ckptr:
      ckptr.save(f'{tmp}/ckpt', {'params': half, 'opt_state': half_state})
    # Abstract targets: the quantized parameters' layout and the state's.
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
  return bool(same and np.isfinite(loss))


if __name__ == '__main__':
  sys.exit(0 if main() else 1)

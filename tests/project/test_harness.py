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
"""Tests for the training harness :mod:`models.train` (single process)."""

import dataclasses
import json
import pathlib
import tempfile
from typing import Any
from typing import NamedTuple

from absl.testing import absltest
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from models import data
from models import gpt
from models import mlp
from models import sharding
from models import train

import helpers


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Int8Leaf:
  """A row-scaled int8 container: a custom pytree node in optimizer state."""

  codes: jax.Array  # param shape, int8.
  scale: jax.Array  # param shape[:-1] + (1,), float32.
  fmt: str = dataclasses.field(default='int8', metadata=dict(static=True))


def _encode(x):
  x = jnp.atleast_1d(x)
  scale = jnp.max(jnp.abs(x), axis=-1, keepdims=True) / 127.0
  codes = jnp.round(x / jnp.where(scale == 0, 1.0, scale))
  return Int8Leaf(jnp.clip(codes, -127, 127).astype(jnp.int8), scale)


class Int8EmaState(NamedTuple):
  """State of :func:`int8_ema`."""

  count: jax.Array  # shape=(), int32.
  ema: Any  # params-shaped tree of Int8Leaf.


def int8_ema(decay: float = 0.5) -> optax.GradientTransformation:
  """EMA of updates stored as int8 (a stand-in for an optax_q transform)."""

  def init_fn(params):
    return Int8EmaState(
        jnp.zeros([], jnp.int32),
        jax.tree.map(lambda p: _encode(jnp.zeros_like(p)), params))

  def update_fn(updates, state, params=None):
    del params
    is_leaf = lambda x: isinstance(x, Int8Leaf)
    ema = jax.tree.map(
        lambda g, q: decay * (q.codes.astype(jnp.float32) * q.scale).reshape(
            g.shape) + (1 - decay) * g,
        updates, state.ema, is_leaf=is_leaf)
    new = Int8EmaState(optax.safe_increment(state.count),
                       jax.tree.map(_encode, ema))
    return ema, new

  return optax.GradientTransformation(init_fn, update_fn)


_TINY_GPT = gpt.GPT(d_model=32, num_layers=1, num_heads=2, max_len=32)


def _tiny_gpt():
  return _TINY_GPT


class TrainTest(absltest.TestCase):

  # Shared by the GPT tests, so that `train` reuses one compiled step.
  gpt_tx = optax.adamw(1e-2, weight_decay=0.1)

  def test_gpt_loss_decreases_and_metrics(self):
    corpus = data.stdlib_corpus(max_bytes=300_000)
    model = _tiny_gpt()
    params = sharding.init_params(model, jnp.zeros((1, 32), jnp.int32))
    with tempfile.TemporaryDirectory() as tmp:
      result = train.train(
          model, params, self.gpt_tx,
          data.lm_batches(corpus.train, 8, 32, seed=0),
          steps=25, loss_fn=train.lm_loss, eval_every=10,
          eval_fn=train.make_eval_fn(
              data.lm_eval_batches(corpus.val, 8, 32, num_batches=2)),
          metrics_path=pathlib.Path(tmp, 'run.json'), progress=False,
          metadata={'corpus': corpus.fingerprint})
      # Loss falls from ~ln(256) = 5.5 towards byte-frequency entropy.
      self.assertGreater(result.losses[0], 5.0)
      self.assertLess(np.mean(result.losses[-5:]), result.losses[0] - 1.0)
      self.assertEqual(result.eval_steps, [10, 20, 25])
      self.assertLess(result.eval_losses[-1], 4.5)
      self.assertEqual(result.unit, 'tokens')
      self.assertEqual(result.items_per_step, 8 * 32)
      self.assertGreater(result.throughput(), 0)
      # The caller's params survive the donating step.
      self.assertFalse(any(x.is_deleted() for x in jax.tree.leaves(params)))
      # Metrics files and plot.
      hist = json.loads(pathlib.Path(tmp, 'run.json').read_text())
      self.assertEqual(hist['metadata']['corpus']['sha256'],
                       corpus.fingerprint['sha256'])
      self.assertLen(hist['losses'], 25)
      rows = pathlib.Path(tmp, 'run.csv').read_text().splitlines()
      self.assertEqual(rows[0], 'step,loss,step_time,eval_loss')
      self.assertLen(rows, 26)
      self.assertNotEqual(rows[10].split(',')[-1], '')
      png = train.plot_curves(
          {'adamw': result, 'from_json': pathlib.Path(tmp, 'run.json')},
          pathlib.Path(tmp, 'curves.png'), title='test')
      self.assertGreater(png.stat().st_size, 1000)

  def test_mlp_learns_digits(self):
    digits = data.load_digits()
    model = mlp.MLP(features=(64,))
    params = sharding.init_params(model, digits.x_train[:1])
    result = train.train(
        model, params, optax.adamw(1e-2),
        data.array_batches(digits.x_train, digits.y_train, 64, seed=0),
        steps=40, loss_fn=train.classification_loss,
        eval_fn=train.make_eval_fn(
            data.array_eval_batches(digits.x_val, digits.y_val),
            train.classification_loss, metrics={'accuracy': train.accuracy}),
        progress=False)
    self.assertEqual(result.unit, 'examples')
    self.assertLess(np.mean(result.losses[-5:]), 0.5 * result.losses[0])
    self.assertGreater(result.evals[-1]['accuracy'], 0.85)

  def test_resume_is_bit_identical(self):
    corpus = data.stdlib_corpus(max_bytes=200_000)
    model = _tiny_gpt()
    params = sharding.init_params(model, jnp.zeros((1, 32), jnp.int32))
    batches = data.lm_batches(corpus.train, 8, 32, seed=5)
    tx = self.gpt_tx
    straight = train.train(
        model, params, tx, batches, steps=6, progress=False)
    with tempfile.TemporaryDirectory() as tmp:
      first = train.train(model, params, tx, batches, steps=3, ckpt_dir=tmp,
                          progress=False)
      self.assertEqual(first.final_step, 3)
      resumed = train.train(model, params, tx, batches, steps=6,
                            ckpt_dir=tmp, resume=True, progress=False)
    self.assertEqual(resumed.start_step, 3)
    self.assertEqual(resumed.final_step, 6)
    helpers.assert_trees_equal(straight.params, resumed.params)
    helpers.assert_trees_equal(straight.opt_state, resumed.opt_state)
    np.testing.assert_array_equal(straight.losses, resumed.losses)

  def test_custom_state_rng_aux_and_iterable_resume(self):
    digits = data.load_digits()
    model = mlp.MLP(features=(32,))
    params = sharding.init_params(model, digits.x_train[:1])
    tx = optax.chain(int8_ema(0.5), optax.adamw(1e-2))
    seen_rng = []

    def loss_fn(model, params, batch, rng):
      seen_rng.append(jax.dtypes.issubdtype(rng.dtype, jax.dtypes.prng_key))
      x, y = batch
      noise = 0.01 * jax.random.normal(rng, x.shape)
      logits = model.apply({'params': params}, x + noise)
      loss = optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()
      return loss, {'acc': jnp.mean(jnp.argmax(logits, -1) == y)}

    def batch_list():  # A plain iterable: resume skips consumed batches.
      batches = data.array_batches(digits.x_train, digits.y_train, 32, seed=1)
      return iter(batches)

    straight = train.train(model, params, tx, batch_list(), steps=6,
                           loss_fn=loss_fn, progress=False, seed=4)
    self.assertTrue(seen_rng and all(seen_rng))
    self.assertLen(straight.train_metrics['acc'], 6)
    ema = straight.opt_state[0].ema['dense_0']['kernel']
    self.assertIsInstance(ema, Int8Leaf)
    self.assertEqual(ema.codes.dtype, jnp.int8)
    with tempfile.TemporaryDirectory() as tmp:
      train.train(model, params, tx, batch_list(), steps=3, loss_fn=loss_fn,
                  ckpt_dir=tmp, progress=False, seed=4)
      resumed = train.train(model, params, tx, batch_list(), steps=6,
                            loss_fn=loss_fn, ckpt_dir=tmp, resume=True,
                            progress=False, seed=4)
    helpers.assert_trees_equal(straight.params, resumed.params)
    helpers.assert_trees_equal(straight.opt_state, resumed.opt_state)
    self.assertEqual(straight.train_metrics, resumed.train_metrics)

  def test_resume_past_end_returns_checkpoint(self):
    digits = data.load_digits()
    model = mlp.MLP(features=(16,))
    params = sharding.init_params(model, digits.x_train[:1])
    batches = data.array_batches(digits.x_train, digits.y_train, 16)
    with tempfile.TemporaryDirectory() as tmp:
      a = train.train(model, params, optax.adamw(1e-3), batches, steps=2,
                      loss_fn=train.classification_loss, ckpt_dir=tmp,
                      progress=False)
      b = train.train(model, params, optax.adamw(1e-3), batches, steps=2,
                      loss_fn=train.classification_loss, ckpt_dir=tmp,
                      resume=True, progress=False)
    self.assertEqual(b.start_step, 2)
    self.assertEqual((b.unit, b.items_per_step), (a.unit, a.items_per_step))
    helpers.assert_trees_equal(a.params, b.params)
    np.testing.assert_array_equal(a.losses, b.losses)


class MultiProcessTest(absltest.TestCase):

  # Slow: about 17 s in the default suite on 2 CPU cores (two worker
  # processes plus a reference run). Multi-process runs stay in the default
  # suite through test_adaptive.py (TwoProcessTest) and test_howtos.py
  # (shard_state_multihost, bit-identical to the unsharded run); the
  # harness's data-parallel run against a single device through
  # test_harness_mesh.py.
  @pytest.mark.slow
  def test_two_processes_match_single_process(self):
    # pylint: disable-next=import-outside-toplevel
    from models import multiprocess_demo
    with tempfile.TemporaryDirectory() as tmp:
      multi = multiprocess_demo.launch(tmp, num_processes=2, timeout=240)
    single = multiprocess_demo.run(None)
    self.assertEqual(multi['fingerprint']['sha256'],
                     single['fingerprint']['sha256'])
    # Same global batches; only the order of the gradient reduction differs.
    np.testing.assert_allclose(multi['losses'], single['losses'], rtol=1e-5)
    for k, v in single['params'].items():
      np.testing.assert_allclose(multi['params'][k], v, atol=1e-4, err_msg=k)
    self.assertLess(multiprocess_demo.compare(multi, single)['params'], 1e-4)


if __name__ == '__main__':
  absltest.main()

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
"""Tests for :mod:`models.data`: determinism, splits and fingerprints."""

import hashlib
import pathlib
import sysconfig
import tempfile

from absl.testing import absltest
import numpy as np

from models import data


class StdlibCorpusTest(absltest.TestCase):

  def test_deterministic(self):
    a = data.stdlib_corpus(max_bytes=300_000)
    data._read_stdlib.cache_clear()  # pylint: disable=protected-access
    b = data.stdlib_corpus(max_bytes=300_000)
    self.assertEqual(a.fingerprint, b.fingerprint)
    np.testing.assert_array_equal(a.train, b.train)
    np.testing.assert_array_equal(a.val, b.val)

  def test_fingerprint_and_split(self):
    c = data.stdlib_corpus(max_bytes=300_000, val_fraction=0.1)
    fp = c.fingerprint
    self.assertEqual(fp['source'], 'stdlib')
    self.assertEqual(fp['num_bytes'], 300_000)
    self.assertEqual(c.train.size, 270_000)
    self.assertEqual(c.val.size, 30_000)
    self.assertEqual(c.train.dtype, np.uint8)
    raw = np.concatenate([c.train, c.val]).tobytes()
    self.assertEqual(fp['sha256'], hashlib.sha256(raw).hexdigest())
    self.assertGreater(fp['num_files'], 1)
    self.assertIn('python_version', fp)
    # The corpus starts with the first stdlib file, in sorted order.
    first = data.stdlib_files()[0].read_bytes()
    self.assertEqual(raw[:len(first)], first[:len(raw)])

  def test_prefix_property(self):
    small = data.stdlib_corpus(max_bytes=50_000, val_fraction=0.5)
    big = data.stdlib_corpus(max_bytes=100_000, val_fraction=0.5)
    np.testing.assert_array_equal(small.train, big.train[:25_000])

  def test_files_sorted_and_stdlib_only(self):
    files = data.stdlib_files()
    root = pathlib.Path(sysconfig.get_paths()['stdlib'])
    rel = [f.relative_to(root).as_posix() for f in files]
    self.assertEqual(rel, sorted(rel))
    self.assertTrue(all(r.endswith('.py') for r in rel))
    self.assertFalse(any('site-packages' in r for r in rel))
    self.assertIn('os.py', rel)

  def test_user_file(self):
    with tempfile.TemporaryDirectory() as tmp:
      path = pathlib.Path(tmp, 'text.txt')
      path.write_bytes(bytes(range(256)) * 40)
      c = data.load_corpus(path, val_fraction=0.25)
      self.assertEqual(c.fingerprint['source'], str(path))
      self.assertEqual(c.train.size + c.val.size, 256 * 40)
      self.assertEqual(c.val.size, 256 * 10)
      capped = data.text_file_corpus(path, max_bytes=1000)
      self.assertEqual(capped.fingerprint['num_bytes'], 1000)
    self.assertEqual(data.load_corpus(None, max_bytes=10_000)
                     .fingerprint['source'], 'stdlib')

  def test_bad_fraction(self):
    with self.assertRaisesRegex(ValueError, 'val_fraction'):
      data.stdlib_corpus(max_bytes=1000, val_fraction=0.0)


class LMBatchesTest(absltest.TestCase):

  def setUp(self):
    super().setUp()
    self.corpus = data.stdlib_corpus(max_bytes=100_000)

  def test_same_seed_same_step_same_batch(self):
    a = data.lm_batches(self.corpus.train, 4, 32, seed=7)
    b = data.lm_batches(self.corpus.train, 4, 32, seed=7)
    for step in (0, 1, 1000):
      for x, y in zip(a(step), b(step)):
        np.testing.assert_array_equal(x, y)
    self.assertFalse(np.array_equal(a(0)[0], a(1)[0]))
    c = data.lm_batches(self.corpus.train, 4, 32, seed=8)
    self.assertFalse(np.array_equal(a(0)[0], c(0)[0]))

  def test_iteration_matches_step_indexing(self):
    batches = data.lm_batches(self.corpus.train, 2, 8, seed=1, start_step=5)
    it = iter(batches)
    for step in range(5, 8):
      x, y = next(it)
      np.testing.assert_array_equal(x, batches(step)[0])
      np.testing.assert_array_equal(y, batches(step)[1])

  def test_shapes_and_shift(self):
    x, y = data.lm_batch(self.corpus.train, 3, 16, seed=0, step=0)
    self.assertEqual(x.shape, (3, 16))
    self.assertEqual(x.dtype, np.int32)
    self.assertEqual(y.dtype, np.int32)
    np.testing.assert_array_equal(x[:, 1:], y[:, :-1])
    self.assertTrue(((x >= 0) & (x < 256)).all())

  def test_eval_batches(self):
    a = data.lm_eval_batches(self.corpus.val, 4, 16, num_batches=3)
    b = data.lm_eval_batches(self.corpus.val, 4, 16, num_batches=3)
    self.assertLen(a, 3)
    for (xa, ya), (xb, yb) in zip(a, b):
      np.testing.assert_array_equal(xa, xb)
      np.testing.assert_array_equal(ya, yb)
    flat = np.concatenate([x for x, _ in a]).reshape(-1)
    np.testing.assert_array_equal(flat, self.corpus.val[:flat.size])


class DigitsTest(absltest.TestCase):

  def test_split_and_normalisation(self):
    d = data.load_digits()
    self.assertEqual(d.x_train.shape[1], 64)
    self.assertEqual(len(d.x_train) + len(d.x_val), 1797)
    self.assertEqual(len(d.x_val), 359)
    self.assertEqual(d.x_train.dtype, np.float32)
    self.assertEqual(d.y_train.dtype, np.int32)
    self.assertAlmostEqual(float(d.x_train.mean()), 0.0, places=4)
    self.assertAlmostEqual(float(d.x_train.std()), 1.0, places=4)
    self.assertEqual(set(np.unique(d.y_train)), set(range(10)))
    e = data.load_digits()
    np.testing.assert_array_equal(d.x_val, e.x_val)
    self.assertEqual(d.fingerprint, e.fingerprint)

  def test_batches(self):
    d = data.load_digits()
    a = data.array_batches(d.x_train, d.y_train, 32, seed=3)
    x, y = a(10)
    self.assertEqual(x.shape, (32, 64))
    np.testing.assert_array_equal(x, a(10)[0])
    np.testing.assert_array_equal(y, a(10)[1])
    evals = data.array_eval_batches(d.x_val, d.y_val, 100)
    self.assertLen(evals, 3)
    self.assertLen(data.array_eval_batches(d.x_val, d.y_val), 1)


if __name__ == '__main__':
  absltest.main()

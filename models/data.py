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
"""Datasets that need no download.

* A byte-level language-modelling corpus made of the Python standard library's
  own ``.py`` files (:func:`stdlib_corpus`), or of any text file the user
  gives (:func:`text_file_corpus`, :func:`load_corpus`). The stdlib differs
  between Python versions, so every :class:`Corpus` carries a
  ``fingerprint`` (sha256 of the bytes, file count, Python version) that
  results should record.
* scikit-learn's bundled 8x8 digits (:func:`load_digits`).

Batches are pure functions of ``(seed, step)``: :class:`StepBatches` is both
callable (``batches(step)``) and iterable, so a training run resumed at step
``k`` sees exactly the batches an uninterrupted run would.
"""

from collections.abc import Callable
from collections.abc import Iterator
import dataclasses
import functools
import hashlib
import os
import pathlib
import platform
import sysconfig
from typing import Any

import numpy as np

DEFAULT_MAX_BYTES = 8_000_000
_SKIP_DIRS = frozenset({'site-packages', 'dist-packages', '__pycache__'})

Batch = tuple[np.ndarray, np.ndarray]


@dataclasses.dataclass(frozen=True)
class Corpus:
  """A byte corpus with a fixed train/validation split.

  Attributes:
    train: uint8 array, the first ``1 - val_fraction`` of the bytes.
    val: uint8 array, the last ``val_fraction`` of the bytes.
    fingerprint: JSON-serialisable description of the corpus: ``source``,
      ``sha256`` (of all bytes, train then val), ``num_bytes``,
      ``num_files``, ``val_fraction``, ``python_version``.
  """

  train: np.ndarray
  val: np.ndarray
  fingerprint: dict[str, Any]

  vocab_size = 256


class StepBatches:
  """Deterministic batches indexed by step.

  ``batches(step)`` returns the batch of global step ``step``;
  ``iter(batches)`` yields the batches of steps ``start_step, start_step+1,
  ...`` forever. The training harness calls ``batches(step)`` so that a
  resumed run needs no replay.

  Attributes:
    fn: ``step -> batch``.
    start_step: first step yielded by ``iter``.
  """

  def __init__(self, fn: Callable[[int], Batch], start_step: int = 0):
    self.fn = fn
    self.start_step = start_step

  def __call__(self, step: int) -> Batch:
    return self.fn(step)

  def __iter__(self) -> Iterator[Batch]:
    step = self.start_step
    while True:
      yield self.fn(step)
      step += 1


def stdlib_files(stdlib: str | None = None) -> list[pathlib.Path]:
  """The standard library's ``.py`` files, sorted by relative POSIX path.

  ``site-packages``, ``dist-packages`` and ``__pycache__`` are skipped, so
  installed third-party packages never enter the corpus.
  """
  root = pathlib.Path(stdlib or sysconfig.get_paths()['stdlib'])
  files = []
  for dirpath, dirnames, filenames in os.walk(root):
    dirnames[:] = [d for d in dirnames if d not in _SKIP_DIRS]
    files.extend(
        pathlib.Path(dirpath, f) for f in filenames if f.endswith('.py'))
  return sorted(files, key=lambda p: p.relative_to(root).as_posix())


@functools.lru_cache(maxsize=4)
def _read_stdlib(max_bytes: int | None) -> tuple[bytes, int]:
  chunks, total, count = [], 0, 0
  for path in stdlib_files():
    if max_bytes is not None and total >= max_bytes:
      break
    data = path.read_bytes()
    if max_bytes is not None:
      data = data[:max_bytes - total]
    chunks.append(data)
    total += len(data)
    count += 1
  return b''.join(chunks), count


def _split(raw: bytes, val_fraction: float, fingerprint: dict[str, Any]):
  if not 0.0 < val_fraction < 1.0:
    raise ValueError(f'val_fraction must be in (0, 1), got {val_fraction}')
  data = np.frombuffer(raw, dtype=np.uint8)
  n_val = int(round(len(data) * val_fraction))
  fingerprint = dict(
      fingerprint,
      sha256=hashlib.sha256(raw).hexdigest(),
      num_bytes=len(data),
      val_fraction=val_fraction,
      train_bytes=len(data) - n_val,
      val_bytes=n_val,
      python_version=platform.python_version(),
  )
  return Corpus(data[:len(data) - n_val], data[len(data) - n_val:], fingerprint)


def stdlib_corpus(
    max_bytes: int | None = DEFAULT_MAX_BYTES,
    val_fraction: float = 0.1,
) -> Corpus:
  """The Python standard library's sources as one byte string.

  Files are read in :func:`stdlib_files` order and concatenated; reading
  stops after ``max_bytes`` bytes (the last file is truncated). The last
  ``val_fraction`` of the bytes is the validation split.

  Args:
    max_bytes: cap on the corpus size; ``None`` reads everything (~30 MB
      for CPython 3.11).
    val_fraction: fraction of bytes, taken from the end, used for
      validation.

  Returns:
    A :class:`Corpus` whose fingerprint has ``source='stdlib'``.

  Examples:
    >>> from models import data
    >>> corpus = data.stdlib_corpus(max_bytes=100_000)
    >>> corpus.train.size + corpus.val.size
    100000
  """
  raw, count = _read_stdlib(max_bytes)
  # No install path in the fingerprint: results must not name machine paths.
  return _split(raw, val_fraction, dict(
      source='stdlib', num_files=count, max_bytes=max_bytes))


def text_file_corpus(
    path: str | os.PathLike[str],
    max_bytes: int | None = None,
    val_fraction: float = 0.1,
) -> Corpus:
  """A user's own file as a byte corpus (any encoding: bytes are tokens)."""
  raw = pathlib.Path(path).read_bytes()
  if max_bytes is not None:
    raw = raw[:max_bytes]
  return _split(raw, val_fraction, dict(
      source=os.fspath(path), num_files=1, max_bytes=max_bytes))


def load_corpus(
    path: str | os.PathLike[str] | None = None,
    max_bytes: int | None = DEFAULT_MAX_BYTES,
    val_fraction: float = 0.1,
) -> Corpus:
  """:func:`text_file_corpus` of ``path`` if given, else :func:`stdlib_corpus`.

  Scripts expose this as ``--data PATH``.
  """
  if path:
    return text_file_corpus(path, max_bytes, val_fraction)
  return stdlib_corpus(max_bytes, val_fraction)


def _rng(seed: int, step: int) -> np.random.Generator:
  return np.random.default_rng([int(seed), int(step)])


def lm_batch(
    data: np.ndarray, batch_size: int, seq_len: int, seed: int, step: int,
) -> Batch:
  """The language-modelling batch of ``step``: random windows of ``data``.

  Returns:
    ``(inputs, targets)``, int32 arrays of shape ``(batch_size, seq_len)``
    with ``targets[:, t] == inputs[:, t + 1]`` inside a window.
  """
  if len(data) < seq_len + 1:
    raise ValueError(f'corpus of {len(data)} bytes < seq_len + 1')
  starts = _rng(seed, step).integers(
      0, len(data) - seq_len, size=batch_size)
  idx = starts[:, None] + np.arange(seq_len + 1)[None, :]
  window = np.asarray(data)[idx].astype(np.int32)
  return window[:, :-1], window[:, 1:]


def lm_batches(
    data: np.ndarray,
    batch_size: int,
    seq_len: int,
    seed: int = 0,
    start_step: int = 0,
) -> StepBatches:
  """Deterministic training batches for a byte corpus.

  Args:
    data: uint8 array, e.g. ``corpus.train``.
    batch_size: global batch size.
    seq_len: tokens per example.
    seed: data seed; the batch of step ``s`` depends only on
      ``(seed, s)``.
    start_step: first step yielded when iterated.

  Returns:
    A :class:`StepBatches` yielding ``(inputs, targets)`` int32 arrays.

  Examples:
    >>> import numpy as np
    >>> from models import data
    >>> batches = data.lm_batches(np.arange(100, dtype=np.uint8), 2, 8)
    >>> inputs, targets = next(iter(batches))
    >>> inputs.shape, bool((inputs[:, 1:] == targets[:, :-1]).all())
    ((2, 8), True)
  """
  return StepBatches(
      functools.partial(lm_batch, data, batch_size, seq_len, seed),
      start_step)


def lm_eval_batches(
    data: np.ndarray,
    batch_size: int,
    seq_len: int,
    num_batches: int | None = None,
) -> list[Batch]:
  """A fixed validation set: consecutive non-overlapping windows of ``data``.

  Args:
    data: uint8 array, e.g. ``corpus.val``.
    batch_size: examples per batch.
    seq_len: tokens per example.
    num_batches: cap on the number of batches (``None``: all full batches).

  Returns:
    A list of ``(inputs, targets)`` int32 batches, identical on every call.
  """
  n_windows = (len(data) - 1) // seq_len
  n_batches = n_windows // batch_size
  if num_batches is not None:
    n_batches = min(n_batches, num_batches)
  if n_batches == 0:
    raise ValueError('validation data too small for one batch')
  out = []
  for b in range(n_batches):
    starts = (b * batch_size + np.arange(batch_size)) * seq_len
    idx = starts[:, None] + np.arange(seq_len + 1)[None, :]
    window = np.asarray(data)[idx].astype(np.int32)
    out.append((window[:, :-1], window[:, 1:]))
  return out


@dataclasses.dataclass(frozen=True)
class Digits:
  """scikit-learn's 8x8 digits with a fixed split.

  Attributes:
    x_train: float32 ``(n_train, 64)``, standardised.
    y_train: int32 ``(n_train,)`` labels 0-9.
    x_val: float32 ``(n_val, 64)``, standardised with the train statistics.
    y_val: int32 ``(n_val,)``.
    fingerprint: ``source``, ``sha256`` of the raw data, split sizes.
  """

  x_train: np.ndarray
  y_train: np.ndarray
  x_val: np.ndarray
  y_val: np.ndarray
  fingerprint: dict[str, Any]

  num_classes = 10


def load_digits(val_fraction: float = 0.2, split_seed: int = 0) -> Digits:
  """The bundled 8x8 digits (1797 images), shuffled once and split.

  Pixels (0-16) are divided by 16, then standardised with the scalar mean
  and std of the training split.
  """
  from sklearn import datasets  # pylint: disable=import-outside-toplevel
  raw = datasets.load_digits()
  x = raw.data.astype(np.float32) / 16.0
  y = raw.target.astype(np.int32)
  perm = np.random.default_rng(split_seed).permutation(len(x))
  n_val = int(round(len(x) * val_fraction))
  tr, va = perm[:len(x) - n_val], perm[len(x) - n_val:]
  mean, std = x[tr].mean(), x[tr].std()
  norm = lambda a: ((a - mean) / std).astype(np.float32)
  digest = hashlib.sha256(raw.data.tobytes() + raw.target.tobytes())
  return Digits(norm(x[tr]), y[tr], norm(x[va]), y[va], dict(
      source='sklearn.datasets.load_digits', sha256=digest.hexdigest(),
      train=len(tr), val=len(va), split_seed=split_seed))


def array_batches(
    x: np.ndarray,
    y: np.ndarray,
    batch_size: int,
    seed: int = 0,
    start_step: int = 0,
) -> StepBatches:
  """Deterministic ``(x, y)`` minibatches (no repeats within a step)."""
  def batch(step):
    idx = _rng(seed, step).choice(len(x), size=batch_size, replace=False)
    return x[idx], y[idx]
  return StepBatches(batch, start_step)


def array_eval_batches(
    x: np.ndarray, y: np.ndarray, batch_size: int | None = None,
) -> list[Batch]:
  """Consecutive ``(x, y)`` batches; the remainder is dropped.

  ``batch_size=None`` gives one batch holding everything.
  """
  if batch_size is None:
    return [(x, y)]
  return [(x[i:i + batch_size], y[i:i + batch_size])
          for i in range(0, len(x) - batch_size + 1, batch_size)]

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
"""Adaptive bit-widths in a two-process ``jax.distributed`` run.

Also the parameters and gradients ``test_adaptive`` uses. As a script, one
worker of a run over one CPU device per process::

  python tests/adaptive_worker.py --process-id 0 --num-processes 2 \
      --port 12355 --out runs/adaptive_worker &
  python tests/adaptive_worker.py --process-id 1 --num-processes 2 \
      --port 12355 --out runs/adaptive_worker
"""

import argparse
import hashlib
import json
import os
import pathlib
import subprocess
import sys
import time

import jax
import numpy as np
import optax

from models import multiprocess_demo

STEPS = 12


def params():
  """Three 64 x 128 matrices."""
  key = jax.random.key(0)
  return {name: jax.random.normal(jax.random.fold_in(key, i), (64, 128))
          for i, name in enumerate(('big', 'calm', 'spiky'))}


def grads(i):
  """Host gradients of step ``i`` (NumPy, so that every sharding of the step
  sees the same bits): 'big' 30x the others (magnitude); 'spiky' one
  element in 97 forty times larger (dispersion); 'calm' neither."""
  rng = np.random.default_rng(1000 + i)
  g = {k: rng.standard_normal((64, 128)).astype(np.float32)
       for k in ('big', 'calm', 'spiky')}
  g['big'] *= 30.0
  g['spiky'] *= np.where(np.arange(64 * 128).reshape(64, 128) % 97 == 0,
                         40.0, 1.0).astype(np.float32)
  return g


def flapping_grads(i):
  """As :func:`grads`, with 'calm' 1000x larger every other 3 steps."""
  g = grads(i)
  if (i // 3) % 2 == 0:
    g['calm'] *= 1000.0
  return g


def step_fn(tx):
  def step(p, s, g):
    u, s = tx.update(g, s, p)
    return optax.apply_updates(p, u), s
  return step


def make_tx():
  # pylint: disable-next=import-outside-toplevel
  import optax_q
  return optax.chain(
      optax_q.adaptive_bits(optax.scale_by_adam(), period=2, patience=2,
                            min_size=0, block_size=32, anneal_steps=8),
      optax.scale(-1e-2))


def digest(tree) -> str:
  """sha256 of every buffer's bytes (gathered across processes)."""
  h = hashlib.sha256()
  for x in jax.tree.leaves(tree):
    h.update(_gathered(x).tobytes())
  return h.hexdigest()


def train(mesh=None):
  """The run: returns the layout after every step and the final digest."""
  # pylint: disable-next=import-outside-toplevel
  import optax_q
  from jax.sharding import NamedSharding, PartitionSpec as P  # pylint: disable=g-import-not-at-top,import-outside-toplevel
  tx = make_tx()
  p = params()
  shardings = None
  state = tx.init(p)
  if mesh is not None:
    specs = {'big': P('data', None), 'calm': P(None, 'data'),
             'spiky': P('data', None)}
    shardings = {k: NamedSharding(mesh, s) for k, s in specs.items()}
    state_sh = optax_q.state_shardings(jax.eval_shape(tx.init, p), shardings)
    host_p, host_s = p, state
    p = jax.tree.map(
        lambda x, s: jax.make_array_from_callback(
            x.shape, s, lambda idx, x=np.asarray(x): x[idx]),
        host_p, shardings)
    state = jax.tree.map(
        lambda x, s: jax.make_array_from_callback(
            x.shape, s, lambda idx, x=np.asarray(x): x[idx]),
        host_s, state_sh)
  step = jax.jit(step_fn(tx))
  layouts = []
  for i in range(STEPS):
    g = grads(i)
    if mesh is not None:
      g = jax.tree.map(
          lambda x, s: jax.make_array_from_callback(
              x.shape, s, lambda idx, x=x: x[idx]), g, shardings)
    p, state = step(p, state, g)
    state = optax_q.relayout(state, step=i + 1, param_shardings=shardings)
    layouts.append(optax_q.bit_layout(state))
  return dict(layouts=layouts, digest=digest((p, state)),
              params={k: _gathered(v).tolist() for k, v in p.items()})


def _gathered(x) -> np.ndarray:
  # pylint: disable-next=import-outside-toplevel
  from jax.experimental import multihost_utils
  if isinstance(x, jax.Array) and not x.is_fully_addressable:
    x = multihost_utils.process_allgather(x, tiled=True)
  return np.asarray(x)


def run_single():
  return train(None)


def worker(process_id, num_processes, port, out):
  jax.distributed.initialize(
      coordinator_address=f'localhost:{port}', num_processes=num_processes,
      process_id=process_id, initialization_timeout=120)
  try:
    mesh = jax.make_mesh((jax.device_count(),), ('data',))
    result = train(mesh)
    pathlib.Path(out, f'worker{process_id}.json').write_text(
        json.dumps(result))
  finally:
    jax.distributed.shutdown()


def launch(out, num_processes=2, timeout=240, *, script=__file__,
           local_devices=1, args=()):
  """Runs ``num_processes`` copies of ``script`` (this worker, or another
  with the same flags), each on ``local_devices`` CPU devices, with
  ``args`` added to their flags; returns their results in process order."""
  port = multiprocess_demo.free_port()
  repo = pathlib.Path(__file__).resolve().parent.parent
  env = dict(os.environ, JAX_PLATFORMS='cpu', XLA_FLAGS=(
      f'--xla_force_host_platform_device_count={local_devices}'))
  env['PYTHONPATH'] = os.pathsep.join(
      [str(repo), str(repo / 'tests')]
      + ([env['PYTHONPATH']] if env.get('PYTHONPATH') else []))
  logs = [pathlib.Path(out, f'worker{i}.log') for i in range(num_processes)]
  procs = []
  try:
    for i, log in enumerate(logs):
      with log.open('w') as f:
        procs.append(subprocess.Popen(
            [sys.executable, os.path.abspath(script), '--process-id',
             str(i), '--num-processes', str(num_processes), '--port',
             str(port), '--out', os.fspath(out), *args],
            env=env, cwd=repo, stdout=f, stderr=subprocess.STDOUT))
    deadline = time.monotonic() + timeout
    while any(p.poll() is None for p in procs):
      if time.monotonic() > deadline or any(p.poll() for p in procs):
        break
      time.sleep(0.1)
  finally:
    for p in procs:
      if p.poll() is None:
        p.kill()
      p.wait()
  if any(p.returncode for p in procs):
    raise RuntimeError('worker failed:\n' + '\n----\n'.join(
        f'{log}:\n{log.read_text()[-4000:]}' for log in logs))
  return [json.loads(pathlib.Path(out, f'worker{i}.json').read_text())
          for i in range(num_processes)]


if __name__ == '__main__':
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--process-id', type=int, required=True)
  parser.add_argument('--num-processes', type=int, default=2)
  parser.add_argument('--port', type=int, required=True)
  parser.add_argument('--out', required=True)
  args = parser.parse_args()
  worker(args.process_id, args.num_processes, args.port, args.out)

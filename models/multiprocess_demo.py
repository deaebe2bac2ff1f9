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
"""Multi-process data-parallel training on one machine via ``jax.distributed``.

Each process runs on one CPU device; together they form a 2-device
``('data', 'model')`` mesh of shape ``(num_processes, 1)``. Every process
builds the same *global* batch and contributes its own rows
(:func:`models.train.place_batch`). The result should match a single-process
run on the same global batches up to float reduction order.

Run the two processes by hand::

  python -m models.multiprocess_demo --process-id 0 --port 12355 --out runs/mp &
  python -m models.multiprocess_demo --process-id 1 --port 12355 --out runs/mp

or all at once (also runs the single-process reference and compares)::

  python -m models.multiprocess_demo --launch --out runs/mp
"""

import argparse
import json
import os
import pathlib
import socket
import subprocess
import sys
import time
from typing import Any

import jax
from jax.experimental import multihost_utils
import jax.numpy as jnp
import numpy as np
import optax

from models import data
from models import gpt
from models import sharding
from models import train

DEFAULTS = dict(
    d_model=32, num_layers=1, num_heads=2, seq_len=16, batch_size=8,
    steps=4, learning_rate=3e-3, max_bytes=200_000, seed=0)


def run(
    mesh: Any = None,
    *,
    d_model: int = DEFAULTS['d_model'],
    num_layers: int = DEFAULTS['num_layers'],
    num_heads: int = DEFAULTS['num_heads'],
    seq_len: int = DEFAULTS['seq_len'],
    batch_size: int = DEFAULTS['batch_size'],
    steps: int = DEFAULTS['steps'],
    learning_rate: float = DEFAULTS['learning_rate'],
    max_bytes: int = DEFAULTS['max_bytes'],
    seed: int = DEFAULTS['seed'],
) -> dict[str, Any]:
  """Train the tiny GPT with AdamW; returns losses, eval and host params.

  With ``mesh=None`` the run uses the default device; with a mesh it is
  data-parallel over ``'data'``. All processes must call this together.
  """
  corpus = data.stdlib_corpus(max_bytes=max_bytes)
  model = gpt.GPT(d_model=d_model, num_layers=num_layers, num_heads=num_heads,
                  max_len=seq_len)
  example = jnp.zeros((batch_size, seq_len), jnp.int32)
  if mesh is None:
    params, shardings = sharding.init_params(model, example, seed=seed), None
  else:
    params, shardings = sharding.init_sharded(
        model, example, mesh, sharding.logical_rules('data'), seed=seed)
  result = train.train(
      model, params, optax.adamw(learning_rate),
      data.lm_batches(corpus.train, batch_size, seq_len, seed=seed),
      steps=steps, loss_fn=train.lm_loss,
      eval_fn=train.make_eval_fn(
          data.lm_eval_batches(corpus.val, batch_size, seq_len, 2),
          mesh=mesh),
      mesh=mesh, param_shardings=shardings, progress=False)
  if mesh is None:
    host = jax.device_get(result.params)
  else:
    host = multihost_utils.process_allgather(result.params, tiled=True)
  flat = {jax.tree_util.keystr(k): np.asarray(v)
          for k, v in jax.tree_util.tree_leaves_with_path(host)}
  return dict(losses=result.losses, eval_loss=result.eval_losses[-1],
              params=flat, fingerprint=corpus.fingerprint)


def save(out: dict[str, Any], path: str | os.PathLike[str]) -> None:
  """Write a :func:`run` result as ``.npz`` (params) plus ``.json``."""
  path = pathlib.Path(path)
  path.parent.mkdir(parents=True, exist_ok=True)
  np.savez(path.with_suffix('.npz'), losses=out['losses'],
           **{f'param{k}': v for k, v in out['params'].items()})
  path.with_suffix('.json').write_text(json.dumps(dict(
      losses=[float(x) for x in out['losses']],
      eval_loss=float(out['eval_loss']),
      fingerprint=out['fingerprint'])))


def load(path: str | os.PathLike[str]) -> dict[str, Any]:
  """Read what :func:`save` wrote."""
  path = pathlib.Path(path)
  npz = np.load(path.with_suffix('.npz'))
  meta = json.loads(path.with_suffix('.json').read_text())
  params = {k[len('param'):]: npz[k] for k in npz.files if k != 'losses'}
  return dict(meta, losses=npz['losses'], params=params)


def worker(process_id: int, num_processes: int, port: int, out_dir: str):
  """One process of the distributed run; process 0 saves ``out_dir/mp``."""
  jax.distributed.initialize(
      coordinator_address=f'localhost:{port}',
      num_processes=num_processes, process_id=process_id,
      initialization_timeout=120)
  try:
    mesh = sharding.make_mesh(data=jax.device_count(), model=1)
    out = run(mesh)
    if jax.process_index() == 0:
      save(out, pathlib.Path(out_dir) / 'mp')
  finally:
    jax.distributed.shutdown()


def free_port() -> int:
  """An unused localhost TCP port."""
  with socket.socket() as s:
    s.bind(('localhost', 0))
    return s.getsockname()[1]


def launch(
    out_dir: str | os.PathLike[str],
    num_processes: int = 2,
    port: int | None = None,
    timeout: float = 300,
) -> dict[str, Any]:
  """Run ``num_processes`` workers on localhost; return process 0's result.

  Raises:
    RuntimeError: if a worker fails (its output is included).
  """
  port = port or free_port()
  repo = pathlib.Path(__file__).resolve().parent.parent
  env = dict(os.environ)
  env['JAX_PLATFORMS'] = 'cpu'
  env['XLA_FLAGS'] = '--xla_force_host_platform_device_count=1'
  env['PYTHONPATH'] = os.pathsep.join(
      [str(repo)] + ([env['PYTHONPATH']] if env.get('PYTHONPATH') else []))
  out_dir = pathlib.Path(out_dir)
  out_dir.mkdir(parents=True, exist_ok=True)
  logs = [out_dir / f'worker{i}.log' for i in range(num_processes)]
  procs = []
  try:
    for i, log in enumerate(logs):
      with log.open('w') as f:
        procs.append(subprocess.Popen(
            [sys.executable, '-m', 'models.multiprocess_demo',
             '--process-id', str(i), '--num-processes', str(num_processes),
             '--port', str(port), '--out', os.fspath(out_dir)],
            env=env, cwd=repo, stdout=f, stderr=subprocess.STDOUT))
    deadline = time.monotonic() + timeout
    timed_out = False
    # Poll all workers: if one dies, the others would wait for it until the
    # coordination timeout, so stop early.
    while any(p.poll() is None for p in procs):
      timed_out = time.monotonic() > deadline
      if timed_out or any(p.poll() for p in procs):
        break
      time.sleep(0.1)
  finally:
    for p in procs:
      if p.poll() is None:
        p.kill()
      p.wait()
  if any(p.returncode for p in procs):
    why = f'timed out after {timeout} s' if timed_out else 'failed'
    raise RuntimeError(f'worker {why}:\n' + '\n----\n'.join(
        f'{log}:\n{log.read_text()[-4000:]}' for log in logs))
  return load(pathlib.Path(out_dir) / 'mp')


def compare(a: dict[str, Any], b: dict[str, Any]) -> dict[str, float]:
  """Largest absolute differences of losses and params between two runs."""
  return dict(
      loss=float(np.max(np.abs(np.asarray(a['losses']) -
                               np.asarray(b['losses'])))),
      params=max(float(np.max(np.abs(a['params'][k] - b['params'][k])))
                 for k in a['params']))


def make_parser() -> argparse.ArgumentParser:
  """The flags of :func:`main`."""
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--process-id', type=int,
                      help="this worker's index, 0 to --num-processes - 1 "
                      '(required unless --launch)')
  parser.add_argument('--num-processes', type=int, default=2,
                      help='processes in the run (default: 2)')
  parser.add_argument('--port', type=int, default=12355,
                      help="the coordinator's TCP port on localhost, the "
                      'same for every worker (default: 12355; --launch '
                      'picks a free one)')
  parser.add_argument('--out', default='runs/multiprocess',
                      help="directory of process 0's result, mp.npz and "
                      "mp.json, and with --launch the workers' logs "
                      'worker<i>.log (default: runs/multiprocess, relative '
                      'to the working directory)')
  parser.add_argument('--launch', action='store_true',
                      help='start all workers here, run the single-process '
                      'reference, print both losses and their largest '
                      'differences')
  return parser


def main(argv=None):
  parser = make_parser()
  args = parser.parse_args(argv)
  if args.launch:
    mp = launch(args.out, args.num_processes)
    single = run(None)
    print(json.dumps(dict(multi_process=mp['losses'].tolist(),
                          single_process=single['losses'].tolist(),
                          max_abs_diff=compare(mp, single)), indent=1))
  elif args.process_id is None:
    parser.error('--process-id or --launch is required')
  else:
    worker(args.process_id, args.num_processes, args.port, args.out)


if __name__ == '__main__':
  main()

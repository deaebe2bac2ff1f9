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
"""Every public transform's jitted step lowers for GPU and TPU.

``jax.export`` lowers a function for platforms this machine does not have:
a step that uses an operation with no GPU or TPU lowering, or a custom
call only the CPU knows, fails here, on every commit, without either
accelerator. One export per transform covers both platforms at once (a
multi-platform module).

The CPU's own execution (tiles of rows in a loop, the fusion device's
conditionals) is chosen by `lax.platform_dependent` when the step is
lowered: an accelerator's module must not hold it.
"""

import re
from unittest import mock

from absl.testing import absltest
from absl.testing import parameterized
import jax
import jax.numpy as jnp
from flax import linen as nn
import optax
import optax_q
from optax_q import quant
from optax_q._src.codec import qarray as qarray_lib

import helpers

PLATFORMS = ('cuda', 'tpu')


def _params():
  keys = jax.random.split(jax.random.key(0), 3)
  return {'w': jax.random.normal(keys[0], (128, 256)) * 0.1,
          'v': jax.random.normal(keys[1], (4, 32, 64)) * 0.1,
          'b': jax.random.normal(keys[2], (256,)) * 0.1}


def _adaptive():
  return optax_q.adaptive_bits(optax.adam(1e-3), period=2)


# name -> a function of no arguments building the transform (built inside
# the test, so that a constructor's failure is that case's failure).
DROPINS = {
    'adamw_int8': lambda: optax_q.adamw(1e-3),
    'adamw_fp8_nearest': lambda: optax_q.adamw(
        1e-3, mu_format='fp8_e4m3', nu_format='fp8_e4m3', rounding='nearest'),
    'adamw_nf4_ue4m0_pow2': lambda: optax_q.adamw(
        1e-3, mu_format='nf4', nu_format='ue4m0', scale_mode='block_pow2'),
    'adamw_recommended_4bit': lambda: optax_q.adamw(
        1e-3, mu_format='nf4', nu_format='int4_mulaw',
        rounding='preconditioner'),
    'adamw_nf3_rank1': lambda: optax_q.adamw(
        1e-3, mu_format='nf3', nu_format='int3_mulaw',
        scale_mode={'nu': 'rank1'}),
    'adam_with_resets': lambda: optax_q.adam_with_resets(
        4, formats={'mu': 'fp8_e4m3', 'nu': 'fp8_e4m3'}),
    'lion_int4': lambda: optax_q.lion(1e-4, mu_format='int4'),
    'sgd_momentum': lambda: optax_q.sgd(1e-2, momentum=0.9),
    'muon': lambda: optax_q.muon(1e-2),
    'shampoo': lambda: optax_q.shampoo(1e-3),
    'soap': lambda: optax_q.soap(1e-3),
    'adaptive_bits': _adaptive,
    'quantize_gradients': lambda: optax.chain(
        optax_q.quantize_gradients('e4m3'), optax.adam(1e-3)),
    'fidelity': lambda: optax_q.track_fidelity(
        optax_q.adamw(1e-3, mu_format='nf4', nu_format='ue4m0'),
        optax.adamw(1e-3), steps=4),
}


# The drop-ins whose step has no control flow of its own: in a GPU or TPU
# module they have no loop, and no conditional but the constant choice of
# `lax.platform_dependent`'s branch.
STRAIGHT = ('adamw_int8', 'adamw_fp8_nearest', 'adamw_nf4_ue4m0_pow2',
            'adamw_recommended_4bit', 'adamw_nf3_rank1', 'lion_int4',
            'sgd_momentum')


def _control_flow(module: str) -> list[str]:
  """The loops of an MLIR module, and its conditionals whose branch index
  is not a constant (or a conditional of constants), function by function."""
  found = []
  for body in module.split('func.func')[1:]:
    constant = set(re.findall(r'(%[\w#]+) = stablehlo\.constant', body))
    for result, index in re.findall(
        r'(%[\w#]+)(?::\d+)? = "stablehlo\.case"\((%[\w#]+)\)', body):
      if index in constant:
        constant.add(result)
      else:
        found.append(f'case on {index}')
    found += ['while'] * body.count('stablehlo.while')
  return found


def _export(step, *args):
  return jax.export.export(jax.jit(step), platforms=PLATFORMS)(*args)


class ExportTest(parameterized.TestCase):

  @parameterized.named_parameters(*DROPINS.items())
  def test_step_lowers_for_gpu_and_tpu(self, make):
    tx = make()
    params = _params()
    state = tx.init(params)

    step = helpers.step_fn(tx)

    exported = _export(step, params, state, params)
    self.assertEqual(exported.platforms, PLATFORMS)
    self.assertNotIn('custom_call @xla_python_cpu_callback',
                     exported.mlir_module())

  @parameterized.named_parameters(*((n, DROPINS[n]) for n in STRAIGHT))
  def test_no_cpu_execution_in_accelerator_modules(self, make):
    tx = make()
    # Large enough to be tiled on CPU (2^19 elements), and one small leaf.
    params = {'w': jnp.ones((512, 1024)) * 0.1, 'b': jnp.ones((256,))}
    state = tx.init(params)

    step = helpers.step_fn(tx)

    cpu = jax.jit(step).lower(params, state, params).as_text()
    self.assertNotEmpty(_control_flow(cpu))  # The CPU's loop is there.
    self.assertEqual(_control_flow(_export(step, params, state, params)
                                   .mlir_module()), [])

  @parameterized.named_parameters(
      ('int8', dict(mu_format='int8', nu_format='int8'), 1),
      ('fp8_int8_dynamic', dict(mu_format='fp8_e4m3',
                                nu_format='int8_dynamic'), 1),
      ('pow2_scales', dict(mu_format='nf4', nu_format='ue4m0',
                           scale_mode='block_pow2'), 1),
      ('rank1', dict(mu_format='nf4', nu_format='ue4m0',
                     scale_mode='rank1'), 0),
      ('bf16_unscaled', dict(mu_format='bf16', nu_format='bf16'), 0))
  def test_block_scales_from_a_second_evaluation(self, formats, extra):
    # Lowered for a GPU or TPU, a leaf with block scales computes its new
    # state twice, the second time behind a barrier of its own (so the
    # compiler reduces it to its scales without writing the new moments
    # to memory); lowered for CPU, and for unscaled or rank-1 state, once:
    # one more barrier per such parameter in the GPU's module than in the
    # CPU's.
    tx = optax_q.adamw(1e-3, **formats)
    params = {'w': jnp.ones((128, 256)) * 0.1}
    state = tx.init(params)

    step = helpers.step_fn(tx)

    def barriers(platform, second=True):
      jax.clear_caches()
      reads = (qarray_lib.reads_scale_source if second
               else lambda fmt, scale_mode: False)
      with mock.patch.object(qarray_lib, 'reads_scale_source', reads):
        module = jax.export.export(jax.jit(step), platforms=(platform,))(
            params, state, params).mlir_module()
      return module.count('stablehlo.optimization_barrier')

    self.assertEqual(barriers('cuda') - barriers('cuda', second=False),
                     extra)
    self.assertEqual(barriers('cpu'), barriers('cpu', second=False))

  @parameterized.product(
      make=(lambda **kw: optax_q.adamw(1e-3, **kw),
            lambda **kw: optax_q.adam(1e-3, **kw),
            lambda mu_format, nu_format, **kw: optax_q.lion(
                1e-4, mu_format=mu_format, **kw),
            lambda mu_format, nu_format, **kw: optax_q.sgd(
                1e-2, momentum=0.9, mu_format=mu_format, **kw)),
      fmt=('fp8_e4m3', 'fp8_e5m2', 'int8', 'int8_dynamic', 'int4',
           'fp8_e4m3_dre'),
      rounding=('nearest', 'stochastic'))
  def test_triton_kernel_for_gpu_where_it_lowers(self, make, fmt, rounding):
    # kernel='pallas' lowered for CUDA: a Triton kernel for the leaves
    # whose formats and rows it lowers (one-byte float and integer grids,
    # rows of a power of two), the XLA path for the others; never a failed
    # export. The dynamic map's lookup, packed 4-bit codes and range
    # expansion take the XLA path, as do a row of 3072 and a row shorter
    # than a scale block.
    tx = make(mu_format=fmt, nu_format=fmt, rounding=rounding,
              kernel='pallas', min_size=0)
    params = {'w': jnp.ones((64, 1024)) * 0.1, 'odd': jnp.ones((8, 3072)),
              'narrow': jnp.ones((512, 64))}
    state = tx.init(params)

    step = helpers.step_fn(tx)

    module = jax.export.export(
        jax.jit(step), platforms=('cuda',),
        disabled_checks=[jax.export.DisabledSafetyCheck.custom_call(
            '__gpu$xla.gpu.triton')])(params, state, params).mlir_module()
    kernels = module.count('@__gpu$xla.gpu.triton(')
    self.assertEqual(kernels, int(fmt in ('fp8_e4m3', 'fp8_e5m2', 'int8')))
    self.assertEqual(_control_flow(module), [])

  @parameterized.parameters('fp8_e4m3', 'int8')
  def test_kernel_lowers_for_tpu(self, fmt):
    # kernel='pallas' is compiled where the step is lowered for TPU: Mosaic
    # lowers the tile kernel from this CPU for tiles in multiples of
    # (8, 128) (the table formats' lookups and the packed 4-bit codes it
    # refuses); tiles of 300 rows take the XLA path.
    tx = optax_q.adamw(1e-3, mu_format=fmt, nu_format=fmt,
                       rounding='nearest', kernel='pallas')
    params = {'w': jnp.ones((1024, 1024)) * 0.1,
              'rows300': jnp.ones((600, 512)) * 0.1}
    state = tx.init(params)

    step = helpers.step_fn(tx)

    module = jax.export.export(jax.jit(step), platforms=('tpu',))(
        params, state, params).mlir_module()
    self.assertEqual(module.count('stablehlo.custom_call @tpu_custom_call'),
                     1)
    self.assertEqual(_control_flow(module), [])

  def test_qat_and_ptq_steps_lower_for_gpu_and_tpu(self):
    # The optax_q.quant tools inside a training step: QuEST and plain-STE
    # QAT (Hadamard rotation, clipping, trust mask) and round-to-nearest
    # PTQ of a Flax layer's weights and inputs, with 8-bit AdamW state.
    layer = nn.Dense(64)
    x = jax.random.normal(jax.random.key(1), (8, 128))
    params = layer.init(jax.random.key(0), x)
    tx = optax_q.adamw(1e-3)
    state = tx.init(params)
    for name, q in (('quest', quant.qat(4)),
                    ('ste', quant.qat(4, method='ste')),
                    ('ptq', quant.ptq(4))):
      with self.subTest(name):

        def step(params, state, x, q=q):
          loss, grads = jax.value_and_grad(
              lambda p: jnp.mean(q(layer.apply)(p, x) ** 2))(params)
          updates, state = tx.update(grads, state, params)
          return optax.apply_updates(params, updates), state, loss

        exported = _export(step, params, state, x)
        self.assertEqual(exported.platforms, PLATFORMS)

  def test_master_free_step_lowers_for_gpu_and_tpu(self):
    tx = optax_q.eco(optax.inject_hyperparams(optax.adamw)(1e-3))
    params = optax_q.quantize_params(_params(), 'fp8_e4m3',
                                     filter='matrices')
    state = tx.init(params)
    grads = optax_q.dequantize_params(params, jnp.float32)

    def step(grads, state, params):
      updates, state = tx.update(grads, state, params)
      return optax_q.apply_updates(params, updates), state

    exported = _export(step, grads, state, params)
    self.assertEqual(exported.platforms, PLATFORMS)


if __name__ == '__main__':
  absltest.main()

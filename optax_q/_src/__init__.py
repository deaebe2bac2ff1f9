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
"""The implementation of optax_q, in layers; each imports only those below.

========================  ===================================================
layer                     sub-packages
========================  ===================================================
drop-ins                  `dropins` (adamw, adam, lion, sgd, muon, shampoo,
                          soap)
features                  `resets`, `adaptive`, `master_free`,
                          `second_order`, `fidelity` (none imports
                          another; `fidelity`, a float32 twin beside any
                          transform, imports `core`, and `codec` to
                          decode quantized params)
state                     `state` (quantize_state, the leafwise pass,
                          sharding, telemetry)
execution                 `execution` (CPU fusion device, Pallas kernels)
codecs                    `codec` (formats, rounding, packing, QArray)
core                      `core` (argument checks, Explicit-mesh helpers)
========================  ===================================================

Codecs and execution sit side by side: neither imports the other. The
QAT/PTQ tools are a package of their own, `optax_q.quant`, on top of the
codecs. `tests/project/test_layers.py` checks every import against `LAYERS`.
"""

# Each sub-package and the sub-packages it may import (besides itself).
LAYERS = {
    'core': (),
    'codec': ('core',),
    'execution': ('core',),
    'state': ('core', 'codec', 'execution'),
    'resets': ('core', 'codec', 'execution', 'state'),
    'adaptive': ('core', 'codec', 'execution', 'state'),
    'master_free': ('core', 'codec', 'execution', 'state'),
    'second_order': ('core', 'codec', 'execution', 'state'),
    'fidelity': ('core', 'codec'),
    'dropins': ('core', 'codec', 'execution', 'state', 'resets',
                'adaptive', 'master_free', 'second_order'),
    'quant': ('core', 'codec'),
}

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
"""The QAT/PTQ tools of `optax_q.quant`, on top of the codec layer.

- `quantizers`: weight and activation quantizers (RTN, QuEST, Hadamard).
- `linear_quant`: `quantize_linear`, `qat`, `ptq` for Flax linear layers.
- `error_propagation`, `outliers`: how quantization error moves through a
  model, and the statistics of its inputs.
- `scaling_law`: fitting loss against bits and parameters.
"""

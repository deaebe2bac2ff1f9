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
"""State: optimizer state stored in `QArray`s.

- `transform`: `quantize_state`, the wrapper that keeps any Optax
  transform's floating state leaves in chosen formats.
- `leafwise`: its per-leaf, tiled pass (decode, inner update, encode).
- `state_tree`: reading state trees (fields, boxes, leaves by field).
- `sharding`: `state_shardings`, the shardings of a quantized state.
- `telemetry`: bytes, bits per element and stalled fractions.
- `migration`: `from_optax` and `to_optax`, between plain Optax states and
  these.
- `numerics`: `check_numerics`, learning rates and ``eps`` against the
  stored precision of weights and second moments.

Imports `core`, `codec` and `execution`; knows no feature.
"""

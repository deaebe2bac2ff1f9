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
"""Drop-ins: the optimizers users call, built from the layers below.

- `alias`: `adamw`, `adam`, `lion`, `sgd` (formats plus one storage
  config around an Optax transform; resets and adaptive bits as wrappers)
  and `adam_with_resets`, their moments with resets.
- `muon`: Muon with quantized momentum.
- `second_order`: `shampoo` and `soap` (stored state, resets, weight decay).

May import every layer and feature; nothing imports it but the package.
"""

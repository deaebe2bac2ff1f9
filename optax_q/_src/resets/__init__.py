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
"""Resets: the staleness model and the resets that undo it.

- `theory`: small pure functions of the stall model (stall probability,
  reset periods, effective precision).
- `resets`: `reset_state`, `reset_where` and local-age bias correction
  (`scale_by_adam_local_age`); `adam_with_resets`, the drop-in's moment
  transform, is in `dropins.alias`.

Imports the layers below (`core`, `codec`, `state`); no other feature.
"""

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
"""optax_q: Optax transforms with small, low-precision optimizer state."""

from optax_q._src.adaptive.adaptive import adaptive_bits
from optax_q._src.adaptive.adaptive import AdaptiveBitsState
from optax_q._src.adaptive.adaptive import bit_layout
from optax_q._src.adaptive.adaptive import bit_widths
from optax_q._src.adaptive.adaptive import BitPolicy
from optax_q._src.adaptive.adaptive import BitStatistics
from optax_q._src.adaptive.adaptive import relayout
from optax_q._src.adaptive.adaptive import upgrade_checkpoint
from optax_q._src.adaptive.adaptive import ZONES
from optax_q._src.codec.formats import Format
from optax_q._src.codec.formats import FORMAT_ALIASES
from optax_q._src.codec.formats import FORMAT_NAMES
from optax_q._src.codec.formats import get_format
from optax_q._src.codec.formats import in_preconditioner_space
from optax_q._src.codec.formats import unsigned_variant
from optax_q._src.codec.qarray import dequantize
from optax_q._src.codec.qarray import is_qarray
from optax_q._src.codec.qarray import QArray
from optax_q._src.codec.qarray import quantize
from optax_q._src.dropins.alias import adam
from optax_q._src.dropins.alias import adam_with_resets
from optax_q._src.dropins.alias import adamw
from optax_q._src.dropins.alias import lion
from optax_q._src.dropins.alias import sgd
from optax_q._src.dropins.muon import muon
from optax_q._src.dropins.second_order import shampoo
from optax_q._src.dropins.second_order import soap
from optax_q._src.fidelity.fidelity import fidelity_summary
from optax_q._src.fidelity.fidelity import FidelityState
from optax_q._src.fidelity.fidelity import track_fidelity
from optax_q._src.fidelity.fidelity import update_fidelity
from optax_q._src.fidelity.fidelity import UpdateFidelity
from optax_q._src.fidelity.fidelity import weight_distance
from optax_q._src.master_free.components import quantized_training
from optax_q._src.master_free.components import QuantizedTraining
from optax_q._src.master_free.eco import eco
from optax_q._src.master_free.eco import EcoState
from optax_q._src.master_free.gradients import quantize_gradients
from optax_q._src.master_free.gradients import QuantizeGradientsState
from optax_q._src.master_free.split import master_weights
from optax_q._src.master_free.split import split_params
from optax_q._src.master_free.split import split_weights
from optax_q._src.master_free.split import SplitWeightsState
from optax_q._src.master_free.weights import apply_updates
from optax_q._src.master_free.weights import dequantize_params
from optax_q._src.master_free.weights import fake_quantize_params
from optax_q._src.master_free.weights import is_linear_kernel
from optax_q._src.master_free.weights import quantize_params
from optax_q._src.resets.resets import reset_state
from optax_q._src.resets.resets import reset_where
from optax_q._src.resets.resets import ResetState
from optax_q._src.resets.resets import scale_by_adam_local_age
from optax_q._src.resets.resets import ScaleByAdamLocalAgeState
from optax_q._src.resets.theory import cycle_staleness
from optax_q._src.resets.theory import effective_decay
from optax_q._src.resets.theory import effective_precision_ratio
from optax_q._src.resets.theory import effective_sample_size
from optax_q._src.resets.theory import format_epsilon
from optax_q._src.resets.theory import reset_period
from optax_q._src.resets.theory import stall_probability
from optax_q._src.resets.theory import startup_window
from optax_q._src.resets.theory import statistical_error
from optax_q._src.resets.theory import transient_stall_probability
from optax_q._src.second_order.shampoo import scale_by_shampoo
from optax_q._src.second_order.shampoo import ScaleByShampooState
from optax_q._src.second_order.soap import scale_by_soap
from optax_q._src.second_order.soap import ScaleBySoapState
from optax_q._src.state.migration import from_optax
from optax_q._src.state.migration import to_optax
from optax_q._src.state.numerics import check_numerics
from optax_q._src.state.numerics import NumericsFinding
from optax_q._src.state.sharding import state_shardings
from optax_q._src.state.telemetry import stall_fraction
from optax_q._src.state.telemetry import state_bits_per_element
from optax_q._src.state.telemetry import state_nbytes
from optax_q._src.state.transform import NONNEGATIVE_FIELDS
from optax_q._src.state.transform import quantize_state
from optax_q._src.state.transform import quantized_leaves
from optax_q._src.state.transform import QuantizedState
from optax_q._src.state.transform import StorageConfig

__version__ = '0.1.0'


def __getattr__(name: str):
  # `optax_q.quant` (model quantization, which needs Flax and SciPy) is
  # imported on first use, so `import optax_q` needs only jax, optax, numpy
  # and ml_dtypes and stays about as fast as `import optax`.
  if name == 'quant':
    import importlib  # pylint: disable=g-import-not-at-top
    return importlib.import_module('optax_q.quant')
  raise AttributeError(f'module {__name__!r} has no attribute {name!r}')


def __dir__():
  return sorted({*globals(), 'quant'})

__all__ = (
    'AdaptiveBitsState',
    'BitPolicy',
    'BitStatistics',
    'EcoState',
    'FORMAT_ALIASES',
    'FORMAT_NAMES',
    'FidelityState',
    'Format',
    'NONNEGATIVE_FIELDS',
    'NumericsFinding',
    'QArray',
    'QuantizeGradientsState',
    'QuantizedState',
    'QuantizedTraining',
    'ResetState',
    'ScaleByAdamLocalAgeState',
    'ScaleByShampooState',
    'ScaleBySoapState',
    'SplitWeightsState',
    'StorageConfig',
    'UpdateFidelity',
    'ZONES',
    'adam',
    'adam_with_resets',
    'adamw',
    'adaptive_bits',
    'apply_updates',
    'bit_layout',
    'bit_widths',
    'check_numerics',
    'cycle_staleness',
    'dequantize',
    'dequantize_params',
    'eco',
    'effective_decay',
    'effective_precision_ratio',
    'effective_sample_size',
    'fake_quantize_params',
    'fidelity_summary',
    'format_epsilon',
    'from_optax',
    'get_format',
    'in_preconditioner_space',
    'is_linear_kernel',
    'is_qarray',
    'lion',
    'master_weights',
    'muon',
    'quantize',
    'quantize_gradients',
    'quantize_params',
    'quantize_state',
    'quantized_leaves',
    'quantized_training',
    'relayout',
    'reset_period',
    'reset_state',
    'reset_where',
    'scale_by_adam_local_age',
    'scale_by_shampoo',
    'scale_by_soap',
    'sgd',
    'shampoo',
    'soap',
    'split_params',
    'split_weights',
    'stall_fraction',
    'stall_probability',
    'startup_window',
    'state_bits_per_element',
    'state_nbytes',
    'state_shardings',
    'statistical_error',
    'to_optax',
    'track_fidelity',
    'transient_stall_probability',
    'unsigned_variant',
    'update_fidelity',
    'upgrade_checkpoint',
    'weight_distance',
)

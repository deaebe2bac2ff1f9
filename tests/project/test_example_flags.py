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
"""Every flag of every script a user runs has help text.

The scripts are found, not listed: every ``examples/*.py``,
``examples/howto/*.py`` and ``models/multiprocess_demo.py`` that uses
``argparse`` and runs as a script. Each is imported (which runs nothing:
the scripts work under ``if __name__ == '__main__'``) and its parser is
taken from its ``make_parser()``; a script without one has its parser
caught as its ``main`` parses (before it does anything else). Every flag
but ``-h`` must have help text, and a flag with a default that a user can
read (not ``None``, not a switch's ``False``) must show it in ``--help``.
"""

import argparse
import importlib
import importlib.util
import pathlib
import sys
from unittest import mock

import pytest

# pylint: disable=protected-access
# (argparse has no public API for a parser's actions or its help strings.)

_ROOT = pathlib.Path(__file__).resolve().parents[2]
_EXAMPLES = _ROOT / 'examples'
sys.path.insert(0, str(_EXAMPLES))


def _scripts() -> list[pathlib.Path]:
  paths = [*sorted(_EXAMPLES.glob('*.py')),
           *sorted((_EXAMPLES / 'howto').glob('*.py')),
           _ROOT / 'models' / 'multiprocess_demo.py']
  return [p for p in paths
          if 'argparse' in (text := p.read_text())
          and '__main__' in text]


SCRIPTS = _scripts()


def _import(path: pathlib.Path):
  if path.parent == _EXAMPLES:
    return importlib.import_module(path.stem)
  if path.parent.name == 'models':
    return importlib.import_module(f'models.{path.stem}')
  # How-tos: by file, as tests/project/test_howtos.py loads them.
  spec = importlib.util.spec_from_file_location(
      f'howto_{path.stem}', path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


class _Caught(Exception):

  def __init__(self, parser):
    super().__init__()
    self.parser = parser


def _catch(self, *args, **kwargs):
  del args, kwargs
  raise _Caught(self)


def _parser(path: pathlib.Path) -> argparse.ArgumentParser:
  module = _import(path)
  if hasattr(module, 'make_parser'):
    return module.make_parser()
  with mock.patch.object(argparse.ArgumentParser, 'parse_args', _catch), \
      mock.patch.object(argparse.ArgumentParser, 'parse_known_args', _catch):
    try:
      module.main([])
    except _Caught as caught:
      return caught.parser
  raise AssertionError(f'{path.name}: no make_parser(), and main() parsed '
                       'no arguments')


def _name(action: argparse.Action) -> str:
  return '/'.join(action.option_strings) or action.dest


def test_scripts_found():
  names = {p.stem for p in SCRIPTS}
  for name in ('demo', 'study_bits', 'study_optimizers_quantization',
               'memory_budget', 'fp_components', 'multiprocess_demo'):
    assert name in names, sorted(names)


@pytest.mark.parametrize(
    'path', SCRIPTS, ids=[str(p.relative_to(_ROOT)) for p in SCRIPTS])
def test_every_flag_has_help(path):
  parser = _parser(path)
  formatter = parser._get_formatter()
  missing, no_default = [], []
  for action in parser._actions:
    if isinstance(action, argparse._HelpAction):
      continue
    if not (action.help or '').strip() or action.help == argparse.SUPPRESS:
      missing.append(_name(action))
      continue
    shown = formatter._get_help_string(action)
    hidden = (action.default is None or action.default is False
              or action.default == argparse.SUPPRESS)
    if not hidden and 'default' not in shown.lower():
      no_default.append(_name(action))
  assert not missing, f'{path.name}: flags without help: {missing}'
  assert not no_default, (
      f'{path.name}: flags whose --help hides their default: {no_default}')
  parser.format_help()  # A stray '%' in a help string fails here.

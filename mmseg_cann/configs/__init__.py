"""The ready-made configs shipped with mmseg-cann, found from an installed package.

The repository's ``configs/`` folder is the one source. A wheel or sdist build copies it
into the package as ``mmseg_cann/.mim/configs`` (the layout OpenMMLab packages use, which
openmim also reads); a checkout or an editable install reads the repository's folder
directly. So the same calls work in both::

    from mmseg_cann.configs import list_configs, config_path, copy_config
    list_configs()                      # ['cityscapes/pspnet_r50-d8_cann_...py', ...]
    config_path('medical/unet-s5-d16_fcn_cann_4xb4-40k_drive-64x64.py')
    copy_config('unet-s5-d16_fcn_cann_4xb4-40k_drive-64x64.py', 'my_project/configs')

or from the shell: ``python -m mmseg_cann.configs list|path|copy``.

How a user's config inherits one (see docs/configs.md): mmengine resolves a ``_base_``
entry either as a path relative to the inheriting file or as ``PACKAGE::PATH`` for the
packages in its own ``MODULE2PACKAGE`` table (OpenMMLab's, checked by an ``assert``
before any plugin can be imported), so ``mmseg_cann::...`` is not a form mmengine accepts.
:func:`copy_config` therefore copies a config *with every local base it inherits*,
keeping their relative layout, so that ``_base_ = ['./configs/medical/NAME.py']`` in the
user's own file works with mmseg's ``tools/train.py`` as it is; the ``mmseg::`` bases
inside the shipped configs resolve through the installed mmseg.
"""
from __future__ import annotations

import ast
import difflib
import filecmp
import os
import shutil
from pathlib import Path
from typing import List

__all__ = ['config_root', 'list_configs', 'config_path', 'base_files', 'copy_config',
           'ConfigNotFound']

_PACKAGE_DIR = Path(__file__).resolve().parent.parent


class ConfigNotFound(ValueError):
    """The config name matches no shipped config (the message lists close names)."""


def config_root() -> Path:
    """The folder holding the shipped configs: the package's ``.mim/configs`` when
    installed from a wheel or sdist, else the repository's ``configs/`` (a checkout or an
    editable install).

    Raises:
        FileNotFoundError: neither exists (a broken installation).
    """
    for candidate in (_PACKAGE_DIR / '.mim' / 'configs', _PACKAGE_DIR.parent / 'configs'):
        if (candidate / '_base_' / 'cann_runtime.py').is_file():
            return candidate
    raise FileNotFoundError(
        f'no shipped configs found next to {_PACKAGE_DIR} (looked for .mim/configs and '
        f'../configs); reinstall mmseg-cann from a wheel or sdist')


def list_configs(include_bases: bool = False) -> List[str]:
    """Every shipped config as a path relative to :func:`config_root` (POSIX separators,
    sorted); the ``_base_`` files only with ``include_bases``."""
    root = config_root()
    names = []
    for path in root.rglob('*.py'):
        rel = path.relative_to(root).as_posix()
        if include_bases or not rel.startswith('_base_/'):
            names.append(rel)
    return sorted(names)


def config_path(name: str) -> str:
    """The absolute path of the shipped config ``name``.

    Args:
        name: a path relative to the config root (``'medical/NAME.py'``), or a bare file
            name when exactly one shipped config has it; the ``.py`` may be left off.

    Raises:
        TypeError: ``name`` is not a string.
        ConfigNotFound: (a ValueError) no config, or several, match; the message lists
            the closest names.
    """
    if not isinstance(name, str):
        raise TypeError(f'name must be a config name (str), got {type(name).__name__}')
    key = name.replace(os.sep, '/').lstrip('./')
    if not key.endswith('.py'):
        key += '.py'
    names = list_configs(include_bases=True)
    if key in names:
        return str(config_root() / key)
    by_file = [n for n in names if n.rsplit('/', 1)[-1] == key]
    if len(by_file) == 1:
        return str(config_root() / by_file[0])
    if by_file:
        raise ConfigNotFound(f'config name {name!r} is ambiguous; give one of: '
                             f'{", ".join(by_file)}')
    close = difflib.get_close_matches(key, names, n=3, cutoff=0.5)
    hint = f'; did you mean {", ".join(close)}?' if close else \
        '; `python -m mmseg_cann.configs list` shows them all'
    raise ConfigNotFound(f'no shipped config named {name!r}{hint}')


def base_files(path: str) -> List[str]:
    """The ``_base_`` entries of the config file ``path`` as written (a string or a list
    of strings), read from its syntax tree as mmengine reads them; package entries
    (``'mmseg::...'``) included."""
    with open(path, encoding='utf-8') as f:
        tree = ast.parse(f.read(), filename=str(path))
    for node in tree.body:
        if (isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name)
                and node.targets[0].id == '_base_'):
            value = ast.literal_eval(node.value)
            return [value] if isinstance(value, str) else list(value)
    return []


def _local_closure(path: Path, root: Path) -> List[Path]:
    """``path`` and every local (non-package) base it inherits, recursively."""
    seen: List[Path] = []
    todo = [path.resolve()]
    while todo:
        current = todo.pop()
        if current in seen:
            continue
        seen.append(current)
        for entry in base_files(str(current)):
            if '::' in entry:
                continue
            base = (current.parent / entry).resolve()
            if root not in base.parents:
                raise FileNotFoundError(f'{current} inherits {entry}, outside the shipped '
                                        f'configs')
            todo.append(base)
    return seen


def copy_config(name: str, dest: str, *, overwrite: bool = False) -> List[str]:
    """Copy the shipped config ``name`` and every local base it inherits into ``dest``,
    keeping their layout relative to the config root, so relative ``_base_`` entries
    keep working; returns the written paths (the config first).

    Args:
        name: as for :func:`config_path`.
        dest: a folder (created if missing).
        overwrite: replace files in ``dest`` that differ from the shipped ones; without
            it such a file is an error and nothing is written.

    Raises:
        ConfigNotFound: unknown ``name``.
        FileExistsError: a differing file exists in ``dest`` (and ``overwrite`` is off),
            or ``dest`` is a file.
    """
    root = config_root().resolve()
    source = Path(config_path(name))
    files = _local_closure(source, root)
    dest_dir = Path(dest)
    if dest_dir.exists() and not dest_dir.is_dir():
        raise FileExistsError(f'dest {dest} is a file, not a folder')
    targets = [(f, dest_dir / f.relative_to(root)) for f in files]
    clashes = [str(t) for f, t in targets
               if t.exists() and not (t.is_file() and filecmp.cmp(f, t, shallow=False))]
    if clashes and not overwrite:
        raise FileExistsError(f'{", ".join(clashes)} already exist(s) and differ(s) from '
                              f'the shipped file(s); pass overwrite=True (--force) to '
                              f'replace them')
    written = []
    for f, target in targets:
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(f, target)
        written.append(str(target))
    return written


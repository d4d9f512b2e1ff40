"""Is this environment what mmseg_cann expects? One table, then findings with what to do.

    python -m mmseg_cann.env_check [--json OUT]      (or tools/env_check.py)

Lists Python, torch, torch_npu, the CANN toolkit version (from ``ASCEND_TOOLKIT_HOME`` /
``ASCEND_HOME_PATH`` and the toolkit's ``version.cfg`` / ``*_install.info`` files), mmcv
(and whether its compiled ops load), mmengine, mmseg, mmseg_cann, numba, triton, onnx and
onnxruntime; the devices (CPU, CUDA, NPU with its SoC name and the capability class the
NPU planner uses); the environment variables that matter on Ascend (``TASK_QUEUE_ENABLE``,
``NPUJITCompile``, ``ASCEND_*``, ``HCCL_*``). Findings: version mismatches, mmcv without
ops, ``NPUJITCompile`` set to a false-looking value (which mmengine treats as true), no NPU
visible while torch_npu is installed. Exit 0 when the environment can run the package
(findings are warnings), 1 when it cannot (an error: mmseg or mmcv's ops fail to import).
"""
from __future__ import annotations

import argparse
import glob
import importlib
import json
import os
import platform
import re
import sys
from dataclasses import asdict, dataclass, field
from typing import Dict, List, Mapping, Optional

from .utils.environment import npu_jit_compile_warning

PACKAGES = ('torch', 'torch_npu', 'mmcv', 'mmengine', 'mmseg', 'mmseg_cann', 'numba',
            'triton', 'onnx', 'onnxruntime')
#: mmsegmentation 1.2.x's accepted mmcv range (mmseg/__init__.py)
MMCV_RANGE = ('2.0.0rc4', '2.2.0')
ENV_PATTERNS = ('TASK_QUEUE_ENABLE', 'NPUJITCompile', 'ASCEND_', 'HCCL_')


@dataclass
class Finding:
    level: str  # 'error' (cannot run) or 'warning'
    message: str


@dataclass
class Report:
    packages: Dict[str, str] = field(default_factory=dict)
    cann: str = 'not found'
    devices: Dict[str, str] = field(default_factory=dict)
    environment: Dict[str, str] = field(default_factory=dict)
    findings: List[Finding] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not any(f.level == 'error' for f in self.findings)


def _version(name: str) -> str:
    """The module's version, 'not installed', or the import error (one line)."""
    try:
        module = importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if exc.name == name:
            return 'not installed'
        return f'import failed: {type(exc).__name__}: {exc}'
    except Exception as exc:  # torch_npu raises without the CANN runtime
        return f'import failed: {type(exc).__name__}: {str(exc).splitlines()[0]}'
    return str(getattr(module, '__version__', 'installed'))


def cann_version(environ: Mapping[str, str]) -> str:
    """The CANN toolkit version from the toolkit folder named by the environment."""
    for var in ('ASCEND_TOOLKIT_HOME', 'ASCEND_HOME_PATH', 'ASCEND_OPP_PATH'):
        home = environ.get(var)
        if not home or not os.path.isdir(home):
            continue
        candidates = [os.path.join(home, 'version.cfg'),
                      os.path.join(home, '..', 'version.cfg')]
        candidates += sorted(glob.glob(os.path.join(home, '*install.info')))
        candidates += sorted(glob.glob(os.path.join(home, '*', '*install.info')))
        for path in candidates:
            version = _read_version_file(path)
            if version:
                return f'{version} ({var}={home})'
        return f'unknown ({var}={home}: no version file)'
    return 'not found (ASCEND_TOOLKIT_HOME / ASCEND_HOME_PATH unset)'


def _read_version_file(path: str) -> Optional[str]:
    try:
        with open(path) as f:
            text = f.read()
    except OSError:
        return None
    match = re.search(r'(?:^|\n)\s*(?:version|Version|toolkit_running_version)\s*[=:]\s*'
                      r'\[?([0-9][\w.\-:]*)', text)
    return match.group(1) if match else None


def _mmcv_ops() -> Optional[str]:
    """None when mmcv's compiled ops load, else the reason."""
    try:
        importlib.import_module('mmcv.ops')
        importlib.import_module('mmcv._ext')
    except Exception as exc:
        return f'{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ""}'
    return None


def _major_minor(version: str):
    match = re.match(r'(\d+)\.(\d+)', version)
    return (int(match.group(1)), int(match.group(2))) if match else None


def _devices(report: Report, npu_version: str) -> None:
    import torch
    report.devices['cpu'] = f'{os.cpu_count()} cores, {platform.machine()}'
    if torch.cuda.is_available():
        names = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
        report.devices['cuda'] = f'{len(names)}: ' + ', '.join(names)
    else:
        report.devices['cuda'] = 'none'
    if npu_version in ('not installed',) or npu_version.startswith('import failed'):
        report.devices['npu'] = 'none (torch_npu ' + npu_version + ')'
        return
    from .backends.npu_device import device_caps
    count = torch.npu.device_count() if torch.npu.is_available() else 0  # type: ignore
    if not count:
        report.devices['npu'] = 'none visible'
        return
    caps = device_caps(torch.device('npu:0'))
    report.devices['npu'] = f'{count}: {caps.name} (SoC {caps.soc_version}, planner class ' \
                            f'{caps.generation})'


def check(environ: Optional[Mapping[str, str]] = None) -> Report:
    """Collect the report for this process (``environ`` defaults to ``os.environ``)."""
    environ = os.environ if environ is None else environ
    report = Report()
    report.packages['python'] = platform.python_version()
    for name in PACKAGES:
        report.packages[name] = _version(name)
    report.cann = cann_version(environ)
    report.environment = {k: v for k, v in sorted(environ.items())
                          if any(k == p or (p.endswith('_') and k.startswith(p))
                                 for p in ENV_PATTERNS)}
    _findings(report, environ)
    _devices(report, report.packages['torch_npu'])
    npu = report.packages['torch_npu']
    if npu not in ('not installed',) and not npu.startswith('import failed') and \
            report.devices.get('npu') == 'none visible':
        report.findings.append(Finding('warning', 'torch_npu is installed but no NPU is '
                                       'visible: check npu-smi info and '
                                       'ASCEND_RT_VISIBLE_DEVICES'))
    return report


def _findings(report: Report, environ: Mapping[str, str]) -> None:
    add = report.findings.append
    packages = report.packages
    mmseg = packages['mmseg']
    if mmseg == 'not installed' or mmseg.startswith('import failed'):
        add(Finding('error', f'mmseg: {mmseg}; mmseg_cann needs mmsegmentation 1.2.x '
                             '(pip install mmsegmentation==1.2.2)'))
    mmcv = packages['mmcv']
    if mmcv == 'not installed' or mmcv.startswith('import failed'):
        add(Finding('error', f'mmcv: {mmcv}; build mmcv 2.1.0 with its ops (MMCV_WITH_OPS=1 '
                             'pip install --no-build-isolation mmcv==2.1.0)'))
    else:
        from packaging.version import Version
        low, high = MMCV_RANGE
        if not Version(low) <= Version(mmcv) < Version(high):
            add(Finding('error', f'mmcv {mmcv} is outside mmseg 1.2\'s range >={low}, <{high}'))
        problem = _mmcv_ops()
        if problem is not None:
            add(Finding('error', f'mmcv {mmcv} has no compiled ops ({problem}); mmseg imports '
                                 'mmcv.ops: reinstall with MMCV_WITH_OPS=1 from source '
                                 '(mmcv-lite does not work with mmseg)'))
    npu = packages['torch_npu']
    if npu not in ('not installed',) and not npu.startswith('import failed'):
        if _major_minor(npu) != _major_minor(packages['torch']):
            add(Finding('warning', f'torch_npu {npu} is built for another torch than '
                                   f'{packages["torch"]}: install the matching pair'))
        if environ.get('TASK_QUEUE_ENABLE') == '0':
            add(Finding('warning', 'TASK_QUEUE_ENABLE=0 turns off torch_npu\'s task queue '
                                   '(op launches become host-bound); unset it or use 1/2'))
    elif npu.startswith('import failed'):
        add(Finding('warning', f'torch_npu: {npu} (source the CANN set_env.sh first)'))
    warning = npu_jit_compile_warning(environ)
    if warning is not None:
        add(Finding('warning', warning))


def format_report(report: Report) -> str:
    rows = [('component', 'version / state')]
    rows += list(report.packages.items())
    rows.append(('CANN toolkit', report.cann))
    rows += [(f'device {k}', v) for k, v in report.devices.items()]
    rows += [(f'env {k}', v) for k, v in report.environment.items()] or \
        [('env (Ascend)', 'none of TASK_QUEUE_ENABLE, NPUJITCompile, ASCEND_*, HCCL_* set')]
    width = max(len(r[0]) for r in rows)
    lines = [f'{a:<{width}}  {b}' for a, b in rows]
    lines.insert(1, '-' * width + '  ' + '-' * 30)
    lines.append('')
    if not report.findings:
        lines.append('findings: none')
    for f in report.findings:
        lines.append(f'{f.level.upper()}: {f.message}')
    lines.append('environment ' + ('OK for mmseg_cann' if report.ok else
                                   'CANNOT run mmseg_cann (see the errors above)'))
    return '\n'.join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog='env_check', description=__doc__.split('\n')[0])
    parser.add_argument('--json', metavar='OUT', help='also write the report as JSON')
    args = parser.parse_args(argv)
    report = check()
    print(format_report(report))
    if args.json:
        try:
            with open(args.json, 'w') as f:
                json.dump(dict(asdict(report), ok=report.ok), f, indent=1)
        except OSError as exc:
            print(f'env_check: error: cannot write --json {args.json!r}: {exc.strerror}',
                  file=sys.stderr)
            return 2
    return 0 if report.ok else 1


if __name__ == '__main__':
    sys.exit(main())

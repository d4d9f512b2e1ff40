"""Packaging for mmseg-cann.

``kernels/`` installs as ``mmseg_cann.kernels``. A wheel or sdist build also copies the
repository's ``configs/`` and ``tools/`` into the package as ``mmseg_cann/.mim/configs``
and ``mmseg_cann/.mim/tools`` (OpenMMLab's layout, read by :mod:`mmseg_cann.configs` and
by openmim); the repository folders stay the one source; an editable install links them.
"""
import os
import shutil

from setuptools import find_packages, setup
from setuptools.command.build_py import build_py

HERE = os.path.dirname(os.path.abspath(__file__))
#: repository folder -> folder under mmseg_cann/.mim in a built package
MIM_FOLDERS = {'configs': 'configs', 'tools': 'tools'}


def read_version():
    scope = {}
    with open(os.path.join(HERE, 'mmseg_cann', 'version.py')) as f:
        exec(f.read(), scope)
    return scope['__version__']


def read_requirements(name):
    with open(os.path.join(HERE, 'requirements', name)) as f:
        return [line.split('#')[0].strip() for line in f
                if line.split('#')[0].strip()]


class BuildPyWithMim(build_py):
    """``build_py`` that also copies configs/ and tools/ into ``mmseg_cann/.mim``."""

    def run(self):
        super().run()
        if getattr(self, 'editable_mode', False):
            self._link_in_source_tree()
            return
        for source, target in MIM_FOLDERS.items():
            src = os.path.join(HERE, source)
            dst = os.path.join(self.build_lib, 'mmseg_cann', '.mim', target)
            if os.path.isdir(dst):
                shutil.rmtree(dst)
            shutil.copytree(src, dst, ignore=shutil.ignore_patterns(
                '__pycache__', '*.pyc', '*.pyo'))

    @staticmethod
    def _link_in_source_tree():
        """Editable install: ``mmseg_cann/.mim/<folder>`` as relative links to the
        repository's folders (as OpenMMLab packages do), so tools that look in ``.mim``
        (openmim) find them; git ignores the links."""
        mim = os.path.join(HERE, 'mmseg_cann', '.mim')
        os.makedirs(mim, exist_ok=True)
        for source, target in MIM_FOLDERS.items():
            link = os.path.join(mim, target)
            if not os.path.lexists(link):
                try:
                    os.symlink(os.path.join('..', '..', source), link)
                except OSError:  # no symlinks here: mmseg_cann.configs reads ../configs
                    pass


packages = find_packages(include=['mmseg_cann', 'mmseg_cann.*'])
packages.append('mmseg_cann.kernels')

setup(
    name='mmseg-cann',
    version=read_version(),
    description='Exact CANN (Ascend NPU) upsampling and pooling modules for MMSegmentation',
    long_description=open(os.path.join(HERE, 'README.md')).read(),
    long_description_content_type='text/markdown',
    python_requires='>=3.9',
    packages=packages,
    package_dir={'mmseg_cann.kernels': 'kernels'},
    cmdclass={'build_py': BuildPyWithMim},
    # torch and mmcv are installed first, by hand (a platform-specific torch build; mmcv
    # compiled against it): see the README. Everything else the code imports is here.
    install_requires=['torch>=2.1', 'mmcv>=2.0.0rc4,<2.2.0'] + read_requirements('runtime.txt'),
    extras_require={
        'npu': ['torch_npu'],
        'triton': ['triton'],
        'onnx': ['onnx', 'onnxruntime', 'onnxscript'],
        # torchao's PT2E quantization flow (mmseg_cann.analysis.pt2e); pinned: its
        # pt2e API moved between releases. It declares no torch requirement, so it never
        # replaces the torch build installed by hand.
        'quant': ['torchao==0.18.0'],
        'test': read_requirements('tests.txt'),
    },
    license='Apache-2.0',
    license_files=['LICENSE'],
    classifiers=[
        'Programming Language :: Python :: 3',
        'License :: OSI Approved :: Apache Software License',
        'Topic :: Scientific/Engineering :: Artificial Intelligence',
    ],
)

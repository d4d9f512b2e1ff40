"""Packaging for mmseg-cann. ``kernels/`` installs as ``mmseg_cann.kernels``."""
import os

from setuptools import find_packages, setup

HERE = os.path.dirname(os.path.abspath(__file__))


def read_version():
    scope = {}
    with open(os.path.join(HERE, 'mmseg_cann', 'version.py')) as f:
        exec(f.read(), scope)
    return scope['__version__']


def read_requirements(name):
    with open(os.path.join(HERE, 'requirements', name)) as f:
        return [line.split('#')[0].strip() for line in f
                if line.split('#')[0].strip()]


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
    install_requires=[
        'torch>=2.1',
        'mmcv>=2.0.0rc4,<2.2.0',
        'mmengine>=0.10',
        'mmsegmentation>=1.2',
        'numpy',
    ],
    extras_require={
        'npu': ['torch_npu'],
        'triton': ['triton'],
        'onnx': ['onnx', 'onnxruntime', 'onnxscript'],
        'test': read_requirements('tests.txt'),
    },
    license='Apache-2.0',
    classifiers=[
        'Programming Language :: Python :: 3',
        'Topic :: Scientific/Engineering :: Artificial Intelligence',
    ],
)

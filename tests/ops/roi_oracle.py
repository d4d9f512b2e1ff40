"""The torchvision oracle of ``roi_pool2d(mode='max')``: its cases, and torchvision's
outputs for them recorded in a committed fixture.

torchvision cannot run in the project's environment (its wheels are CUDA builds of
another torch), so ``make oracle`` makes the side virtualenv ``.venv-torchvision``
(torch 2.14.1 + torchvision 0.29.1, about 5.5 GB) and runs::

    .venv/bin/python -m tests.ops.roi_oracle

which writes :data:`ORACLE_CASES` to a ``.pt`` file, runs ``tools/torchvision_oracle.py``
on it in that virtualenv (``torch.ops.torchvision.roi_pool``'s values and int32 argmax,
and the input gradients through ``torchvision.ops.roi_pool``'s autograd) and saves the
results, with the torch/torchvision versions and :func:`cases_sha256` of the case list,
to :data:`FIXTURE` (lzma-compressed ``torch.save``). The tests compare ``roi_pool2d``
with the fixture bit for bit; they fail, naming ``make oracle``, when the case list (or
the random inputs torch makes from its seeds) no longer hashes to the recorded value.
Where ``.venv-torchvision`` exists, a test also runs the oracle live and compares it
with the fixture.
"""
from __future__ import annotations

import hashlib
import io
import lzma
import os
import subprocess
import sys
import tempfile

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
FIXTURE = os.path.join(HERE, 'roi_pool_torchvision.pt.xz')
ORACLE_VENV = os.path.join(REPO, '.venv-torchvision')
ORACLE_PYTHON = os.path.join(ORACLE_VENV, 'bin', 'python')
ORACLE_TOOL = os.path.join(REPO, 'tools', 'torchvision_oracle.py')
#: the torchvision release whose outputs are the reference
TORCHVISION = '0.29.1'
#: what each case's result holds
FIELDS = ('output', 'argmax', 'grad_input')


# ------------------------------------------------------------------------------ inputs
def random_boxes(k, h, w, seed, margin=5, batch=2, dtype=torch.float32):
    """Random boxes with coordinates in [-margin, size + margin]: some partly or wholly
    outside the map, some reversed, fractional coordinates."""
    g = torch.Generator().manual_seed(seed)
    b = torch.randint(0, batch, (k, 1), generator=g).to(dtype)
    xs = torch.rand(k, 2, generator=g) * (w + 2 * margin) - margin
    ys = torch.rand(k, 2, generator=g) * (h + 2 * margin) - margin
    return torch.cat([b, xs[:, :1], ys[:, :1], xs[:, 1:], ys[:, 1:]], 1).to(dtype)


def inside_boxes(k, h, w, seed, batch=2, dtype=torch.float32):
    """Integer boxes inside the map, sides 1..size."""
    g = torch.Generator().manual_seed(seed)
    sw = torch.randint(1, w + 1, (k,), generator=g)
    sh = torch.randint(1, h + 1, (k,), generator=g)
    x1 = (torch.rand(k, generator=g) * (w - sw + 1)).floor()
    y1 = (torch.rand(k, generator=g) * (h - sh + 1)).floor()
    b = torch.randint(0, batch, (k,), generator=g).float()
    return torch.stack([b, x1, y1, x1 + sw - 1, y1 + sh - 1], 1).to(dtype)


def random_map(shape, seed, dtype=torch.float32, special=False, ties=False):
    """A seeded feature map; ``ties``: few distinct values, ``special``: NaN, +-inf and
    the most negative finite float32 scattered through it."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g, dtype=torch.float64)
    if ties:
        x = x.mul(2).round()  # few distinct values: ties everywhere
    x = x.to(dtype)
    if special:
        flat = x.view(-1)
        flat[::7] = float('nan')
        flat[3::11] = float('-inf')
        flat[5::13] = float('inf')
        flat[6::17] = -torch.finfo(torch.float32).max
    return x


# ------------------------------------------------------------------------------- cases
def _build_cases() -> dict:
    cases = {}

    def case(name, x, rois, size, scale, seed=0):
        g = torch.Generator().manual_seed(seed + 1)
        grad = torch.randn((rois.shape[0], x.shape[1]) + tuple(size), generator=g,
                           dtype=torch.float64).to(x.dtype)
        cases[name] = dict(input=x, rois=rois, output_size=tuple(size), spatial_scale=scale,
                           grad=grad)

    for dtype in (torch.float32, torch.float64):
        t = str(dtype).split('.')[-1]
        for i, (size, scale) in enumerate([((7, 7), 1.0), ((3, 5), 0.5), ((21, 13), 0.3),
                                           ((1, 1), 1.0), ((2, 9), 1 / 16), ((5, 4), 2.0)]):
            hw = (20, 23)
            c = max(1, int(round(1 / scale))) if scale < 1 else 1
            boxes_scale = 16 if scale == 1 / 16 else 1
            case(f'{t}-random-{size}-{scale}', random_map((2, 6) + hw, i, dtype),
                 random_boxes(40, hw[0] * c * boxes_scale, hw[1] * c * boxes_scale, i,
                              dtype=dtype), size, scale, i)
        case(f'{t}-special-values', random_map((2, 5, 12, 14), 9, dtype, special=True),
             random_boxes(60, 12, 14, 9, dtype=dtype), (4, 3), 1.0, 9)
        case(f'{t}-ties', random_map((2, 5, 12, 14), 10, dtype, ties=True),
             random_boxes(60, 12, 14, 10, dtype=dtype), (3, 3), 1.0, 10)
        case(f'{t}-all-neg-inf', torch.full((1, 2, 6, 6), float('-inf'), dtype=dtype),
             torch.tensor([[0, 0, 0, 5, 5], [0, 1, 1, 2, 2]], dtype=dtype), (2, 2), 1.0)
        case(f'{t}-edges', random_map((2, 3, 9, 11), 11, dtype),
             torch.tensor([[0, 0, 0, 10, 8],       # the whole map
                           [1, 4, 4, 4, 4],        # a single cell
                           [1, 3, 0, 3, 8],        # width 1
                           [0, 0, 5, 10, 5],       # height 1
                           [0, 6, 6, 2, 2],        # reversed: one cell at (6, 6)
                           [1, -4, -4, -1, -1],    # wholly outside (before the map)
                           [0, 12, 10, 20, 20],    # wholly outside (after the map)
                           [1, -3, -2, 4, 5],      # partly outside
                           [0, 8, 6, 15, 12],      # partly outside at the end
                           [1, 0.5, 1.5, 2.5, 3.5],      # halves: round away from zero
                           [0, -0.5, -1.5, 0.49, 7.5],
                           [1, 2.4999, 2.5001, 6.5, 7.4999]], dtype=dtype), (3, 4), 1.0)
        case(f'{t}-no-rois', random_map((2, 3, 5, 5), 12, dtype),
             torch.zeros((0, 5), dtype=dtype), (2, 2), 1.0)
        # float32 bins differ from adaptive bins for roi_h = 3 -> 21 rows, 7 -> 13, ...
        case(f'{t}-bin-rule', random_map((1, 4, 30, 30), 13, dtype),
             torch.tensor([[0, 0, 0, 2, 2], [0, 1, 1, 7, 7], [0, 2, 3, 8, 9],
                           [0, 0, 0, 28, 6]], dtype=dtype), (21, 13), 1.0)
    return cases


#: name -> dict(input=, rois=, output_size=, spatial_scale=, grad=): the oracle's cases
ORACLE_CASES = _build_cases()


def _tensor_bytes(t: torch.Tensor) -> bytes:
    return f'{t.dtype} {tuple(t.shape)} '.encode() + t.detach().contiguous().numpy().tobytes()


def cases_sha256(cases: dict = ORACLE_CASES) -> str:
    """The SHA-256 of the case list: names, inputs, boxes, sizes, scales and gradients
    (the bytes of every tensor), so a changed case or seed changes it."""
    h = hashlib.sha256()
    for name, case in cases.items():
        h.update(f'{name}|{tuple(case["output_size"])}|{float(case["spatial_scale"])!r}|'
                 .encode())
        for key in ('input', 'rois', 'grad'):
            h.update(_tensor_bytes(case[key]))
    return h.hexdigest()


# ------------------------------------------------------------------------------ oracle
def oracle_missing() -> str:
    """Why the live oracle cannot run here ('' when it can)."""
    failed = os.path.join(ORACLE_VENV, 'install-failed.txt')
    if os.path.exists(failed):
        with open(failed) as f:
            return f'.venv-torchvision could not be made:\n{f.read()}'
    if not os.path.exists(ORACLE_PYTHON):
        return '.venv-torchvision is missing: run `make oracle` (torchvision oracle)'
    return ''


def run_live_oracle(cases: dict = ORACLE_CASES) -> dict:
    """torchvision's results for ``cases`` from ``.venv-torchvision``: ``dict(torch=,
    torchvision=, results={name: dict(output=, argmax=, grad_input=)})``."""
    with tempfile.TemporaryDirectory() as tmp:
        cases_path, results_path = os.path.join(tmp, 'cases.pt'), os.path.join(tmp, 'r.pt')
        names = list(cases)
        torch.save(dict(cases=[cases[n] for n in names]), cases_path)
        subprocess.run([ORACLE_PYTHON, ORACLE_TOOL, cases_path, results_path], check=True,
                       timeout=600)
        saved = torch.load(results_path, weights_only=True)
    if not saved['torchvision'].startswith(TORCHVISION):
        raise RuntimeError(f'.venv-torchvision has torchvision {saved["torchvision"]}, '
                           f'the oracle is {TORCHVISION}: run `make clean-side-envs oracle`')
    results = {n: {k: r[k] for k in FIELDS} for n, r in zip(names, saved['results'])}
    return dict(torch=saved['torch'], torchvision=saved['torchvision'], results=results)


def save_fixture(live: dict, path: str = FIXTURE, cases: dict = ORACLE_CASES) -> None:
    """Write ``live`` (:func:`run_live_oracle`'s result) with the case list's hash."""
    data = dict(torch=live['torch'], torchvision=live['torchvision'],
                cases_torch=str(torch.__version__), cases_sha256=cases_sha256(cases),
                results=live['results'])
    buffer = io.BytesIO()
    torch.save(data, buffer)
    with open(path, 'wb') as f:
        f.write(lzma.compress(buffer.getvalue(), preset=9 | lzma.PRESET_EXTREME))


def stale_reason(recorded: dict, cases: dict = ORACLE_CASES) -> str:
    """'' when ``recorded`` (:func:`load_fixture`) was made from ``cases``, else why not,
    naming ``make oracle``."""
    if recorded['cases_sha256'] == cases_sha256(cases):
        return ''
    return (f'the ROI oracle cases (tests/ops/roi_oracle.py) changed since torchvision\'s '
            f'outputs for them were recorded in {os.path.relpath(FIXTURE, REPO)} (made from '
            f'torch {recorded["cases_torch"]} inputs; this is torch {torch.__version__}): '
            'run `make oracle` to record them again')


def load_fixture(path: str = FIXTURE) -> dict:
    """The recorded oracle (:func:`save_fixture`'s dict)."""
    with open(path, 'rb') as f:
        return torch.load(io.BytesIO(lzma.decompress(f.read())), weights_only=True)


def main() -> int:
    reason = oracle_missing()
    if reason:
        print(reason, file=sys.stderr)
        return 1
    live = run_live_oracle()
    save_fixture(live)
    print(f'wrote {os.path.relpath(FIXTURE, REPO)} ({os.path.getsize(FIXTURE) / 1e3:.0f} kB): '
          f'{len(ORACLE_CASES)} cases, torchvision {live["torchvision"]} on torch '
          f'{live["torch"]}, case list sha256 {cases_sha256()[:12]}')
    return 0


if __name__ == '__main__':
    sys.exit(main())

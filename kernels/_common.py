"""Helpers shared by the Triton kernels and their launchers (never a kernel file's
private names: kernel files import from here).

* **Indexing.** Tensors are addressed through their strides; the flat element order
  follows the output's layout (NCHW or channels_last), so stores go to ``out + e`` and
  are contiguous. Offsets are int32 unless the launch can form an offset of 2^31 or more
  (:func:`needs_int64`, the constexpr ``INT64`` of every kernel): triton-ascend avoids
  int64 (docs/design.md 2.3), GPUs pay little for it only where it is needed.
* **Launch configuration** is a pure function of the device's properties
  (:class:`DeviceProps`): on CUDA/ROCm the grid covers the work (one block per program,
  no loop; the hardware schedules several blocks per SM); on an NPU (and in the CPU
  interpreter) the grid has at most one program per core and each program loops. Block
  and warp choices come from a small set per kernel family (:func:`candidate_configs`);
  on a GPU the fastest is measured once per kernel, device and variant and cached
  (:class:`Tuner`).
* **One launch point**, :func:`launch`. Inside :func:`launch_context` the device
  properties can be replaced (tests, the ahead-of-time check) and launches recorded
  instead of run (:mod:`.aot` compiles what was recorded).
"""
from __future__ import annotations

import contextlib
import dataclasses
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import triton
import triton.language as tl

from mmseg_cann.core.validation import is_channels_last as channels_last

from . import interpreter_compat

interpreter_compat.apply()

#: offsets at or above this need 64-bit arithmetic
INT32_LIMIT = 2 ** 31


# ----------------------------------------------------------------------------- kernels
@triton.jit
def block_offsets(pid, it, nprog, BLOCK: tl.constexpr, INT64: tl.constexpr):
    """Flat indices of block ``it * nprog + pid``: ``BLOCK`` consecutive elements, int64
    when ``INT64`` (the block number itself always fits in int32)."""
    block = it * nprog + pid
    if INT64:
        block = block.to(tl.int64)
    return block * BLOCK + tl.arange(0, BLOCK)


@triton.jit
def row_tile(pid, it, nprog, W, BLOCK: tl.constexpr, INT64: tl.constexpr):
    """``(row, x0)`` of tile ``it * nprog + pid`` of a row launch: ``cdiv(W, BLOCK)``
    tiles of ``BLOCK`` columns per row of ``W``; ``row`` is int64 when ``INT64``.
    Column indices ``x0 + tl.arange(0, BLOCK)`` are affine, so loads and stores along a
    row are block accesses (no per-element address computation)."""
    ntiles = tl.cdiv(W, BLOCK)
    tile = it * nprog + pid
    row = tile // ntiles
    x0 = (tile - row * ntiles) * BLOCK
    if INT64:
        row = row.to(tl.int64)
    return row, x0


@triton.jit
def row_plane(row, C, H):
    """``(n, c, y)`` of row ``row`` of a row launch over ``N * C * H`` rows."""
    y = row % H
    t = row // H
    return t // C, t % C, y


@triton.jit
def decompose(e, C, H, W, CL: tl.constexpr):
    """``(n, c, y, x)`` of flat index ``e`` in NCHW order, or NHWC order when ``CL``."""
    if CL:
        c = e % C
        t = e // C
        x = t % W
        t = t // W
        y = t % H
        n = t // H
    else:
        x = e % W
        t = e // W
        y = t % H
        t = t // H
        c = t % C
        n = t // C
    return n, c, y, x


# ------------------------------------------------------------------ launch configuration
@dataclasses.dataclass(frozen=True)
class DeviceProps:
    """What the launch configuration depends on, read from the device once.

    ``kind``: ``'cuda'``, ``'hip'`` (ROCm), ``'npu'`` (triton-ascend) or ``'cpu'`` (the
    interpreter); ``cores``: SMs / compute units / vector cores (interpreter: the
    programs to run), which caps the grid where programs loop (NPU, interpreter);
    ``max_grid``: the largest 1-D grid.
    """

    kind: str
    cores: int
    max_grid: int = 2 ** 31 - 1
    name: str = ''


@dataclasses.dataclass(frozen=True)
class Config:
    """Elements per program (a tile kernel splits them into rows x a constexpr inner
    width) and warps per program."""

    block: int
    num_warps: int


#: block/warp choices per kernel family on GPUs, the first being the default. Elements
#: per thread set the registers (measured on sm_90 by the ahead-of-time check: a 3x3 max
#: pool takes about 30/50/100 registers at 1/2/4 elements per thread, and spills at 4):
#: ``map`` - one output element per lane, a few loads each (upsample): 4 per thread, so
#: float32 stores are 16 bytes wide; ``pool`` - a window of taps per element, unrolled:
#: 2 per thread; ``reduce`` - a loop over classes or taps with running values per
#: element (argmax, backward): 2 per thread. The choice within a family is the number of
#: warps (programs of 4 or 8 warps).
GPU_CONFIGS = {
    'map': (Config(512, 4), Config(1024, 8)),
    'pool': (Config(256, 4), Config(512, 8)),
    'reduce': (Config(256, 4), Config(512, 8)),
}
#: one configuration elsewhere: the NPU's unified buffer (192 KB) and the interpreter
#: (a small block, several programs looping, so the loop is exercised)
FIXED_CONFIG = {'npu': Config(256, 4), 'cpu': Config(256, 4)}


def candidate_configs(family: str, props: DeviceProps) -> Tuple[Config, ...]:
    """The configurations a launch of ``family`` may use on a device like ``props``."""
    if family not in GPU_CONFIGS:
        raise ValueError(f'family must be one of {sorted(GPU_CONFIGS)}, got {family!r}')
    if props.kind in FIXED_CONFIG:
        return (FIXED_CONFIG[props.kind],)
    return GPU_CONFIGS[family]


@dataclasses.dataclass(frozen=True)
class Plan:
    """A resolved launch: ``grid`` programs, each handling blocks ``it * nprog + pid``
    for ``it < iters`` of ``block`` elements; ``int64`` offsets or not."""

    grid: Tuple[int]
    nprog: int
    iters: int
    block: int
    num_warps: int
    int64: bool


def plan_launch(total: int, config: Config, props: DeviceProps, max_offset: int = 0,
                inner: int = 1, index_limit: int = INT32_LIMIT, row: int = 0) -> Plan:
    """The launch of ``total`` work items with ``config`` on a device like ``props``.

    ``inner``: the constexpr inner width of a tile kernel (a program then covers
    ``config.block // inner`` items); ``max_offset``: the largest element offset of any
    tensor argument (:func:`max_offset`); ``row``: a row launch (:func:`row_tile`): the
    items are rows of ``row`` columns, each covered by tiles of ``block`` columns
    (``block`` at most the next power of two of ``row``, and at least 16).
    """
    if total < 0 or inner < 1 or row < 0 or (row and total % row):
        raise ValueError(f'total must be >= 0 (a multiple of row), inner >= 1 and row >= 0, '
                         f'got {total}, {inner} and {row}')
    block = max(1, config.block // inner)
    if row:
        block = min(block, max(16, triton.next_power_of_2(row)))
        tiles = total // row * triton.cdiv(row, block)
        nprog = max(1, min(tiles, _grid_cap(props)))
        iters = triton.cdiv(tiles, nprog)
        covered = triton.cdiv(nprog * iters, triton.cdiv(row, block)) * row
        int64 = needs_int64(covered, max_offset, index_limit)
        return Plan((nprog,), nprog, iters, block, config.num_warps, int64)
    programs = max(1, triton.cdiv(total, block))
    nprog = max(1, min(programs, _grid_cap(props)))
    iters = triton.cdiv(programs, nprog)
    int64 = needs_int64(nprog * iters * block, max_offset, index_limit)
    return Plan((nprog,), nprog, iters, block, config.num_warps, int64)


def _grid_cap(props: DeviceProps) -> int:
    if props.kind in ('cuda', 'hip'):
        return props.max_grid  # cover the work: no loop, several blocks resident per SM
    return min(props.cores, props.max_grid)  # one program per core, looping


def needs_int64(covered: int, max_offset: int, index_limit: int = INT32_LIMIT) -> bool:
    """Whether a launch needs 64-bit offsets.

    ``covered`` is the number of flat indices the grid forms (the grid's overshoot past
    the last element included); ``max_offset`` the largest element offset of a tensor
    argument. Its double must fit too: masked lanes past the end form offsets of up to
    one more batch, and pooling forms offsets of taps in the padding (up to the padding
    and the ceil-mode overhang): computed, never dereferenced, but they must not wrap.
    """
    return covered > index_limit or 2 * max_offset >= index_limit


def max_offset(tensors) -> int:
    """The largest element offset inside any of ``tensors`` (storage offset included)."""
    import torch
    best = 0
    for t in tensors:
        if isinstance(t, torch.Tensor) and t.numel():
            span = t.storage_offset() + sum((s - 1) * abs(st)
                                            for s, st in zip(t.shape, t.stride()))
            best = max(best, span)
    return best


def device_props(device) -> DeviceProps:
    """:class:`DeviceProps` of a torch device (cached per device)."""
    import torch
    device = torch.device(device)
    if device.type == 'cuda' and device.index is None:
        device = torch.device('cuda', torch.cuda.current_device())
    key = (device.type, device.index)
    if key not in _PROPS_CACHE:
        if device.type == 'cuda':  # NVIDIA, or AMD through ROCm's torch.cuda
            p = torch.cuda.get_device_properties(device)
            kind = 'hip' if getattr(torch.version, 'hip', None) else 'cuda'
            props = DeviceProps(kind, p.multi_processor_count, name=p.name)
        elif device.type == 'npu':  # vector cores of the Ascend AI core (triton-ascend)
            p = torch.npu.get_device_properties(device)
            props = DeviceProps('npu', int(getattr(p, 'vector_core_num', 40)),
                                max_grid=65535, name=getattr(p, 'name', 'npu'))
        else:  # the interpreter on CPU: a few programs exercise the loop
            props = DeviceProps('cpu', 4, name='interpreter')
        _PROPS_CACHE[key] = props
    return _PROPS_CACHE[key]


_PROPS_CACHE: Dict[tuple, DeviceProps] = {}


# ------------------------------------------------------------------------------ tuning
class Tuner:
    """Picks the fastest configuration once per key and remembers it.

    ``timer(fn)`` returns the time of one call of ``fn`` (default: Triton's
    ``do_bench``, on the current GPU).
    """

    def __init__(self, timer: Optional[Callable[[Callable[[], None]], float]] = None):
        self._timer = timer
        self.best: Dict[tuple, Config] = {}

    def pick(self, key: tuple, candidates: Sequence[Config],
             run: Callable[[Config], None]) -> Config:
        """The cached choice for ``key``, measuring every candidate the first time."""
        if len(candidates) == 1:
            return candidates[0]
        if key not in self.best:
            timer = self._timer or _do_bench
            times = [timer(lambda c=c: run(c)) for c in candidates]
            self.best[key] = candidates[min(range(len(times)), key=times.__getitem__)]
        return self.best[key]


def _do_bench(fn) -> float:
    from triton.testing import do_bench
    return do_bench(fn, warmup=5, rep=20)


TUNER = Tuner()


# ------------------------------------------------------------------------------ launch
@dataclasses.dataclass
class Launch:
    """One kernel launch: what :func:`launch` would pass to ``kernel[grid]``."""

    kernel: object
    grid: Tuple[int]
    args: tuple
    kwargs: dict


@dataclasses.dataclass
class _Context:
    props: Optional[DeviceProps] = None
    index_limit: int = INT32_LIMIT
    record: Optional[List[Launch]] = None


_CONTEXT = _Context()


@contextlib.contextmanager
def launch_context(props: Optional[DeviceProps] = None, *, index_limit: int = INT32_LIMIT,
                   record: Optional[List[Launch]] = None):
    """Within this block, launches use ``props`` instead of the tensors' device,
    ``index_limit`` instead of 2^31 for the int64 decision (tests lower it to run the
    int64 path on small tensors), and, when ``record`` is a list, every launch of every
    candidate configuration is appended to it instead of running."""
    global _CONTEXT
    if props is not None and not isinstance(props, DeviceProps):
        raise TypeError(f'props must be a DeviceProps or None, got {type(props).__name__}')
    if not isinstance(index_limit, int) or index_limit < 1:
        raise ValueError(f'index_limit must be a positive int, got {index_limit!r}')
    saved = _CONTEXT
    _CONTEXT = _Context(props, index_limit, record)
    try:
        yield
    finally:
        _CONTEXT = saved


def launch_kind(tensor) -> str:
    """The kind of device (:attr:`DeviceProps.kind`) a launch on ``tensor`` plans for:
    the context's properties if set, else the tensor's device."""
    return (_CONTEXT.props or device_props(tensor.device)).kind


def recording() -> bool:
    """Whether launches are being recorded (nothing runs)."""
    return _CONTEXT.record is not None


def launch(kernel, family: str, total: int, args: tuple, meta: dict, *,
           inner: int = 1, row: int = 0) -> None:
    """Launch ``kernel`` over ``total`` work items.

    ``args``: the positional arguments up to the loop parameters; the kernel then takes
    ``nprog, iters`` and its constexprs ``meta`` plus ``INT64`` and ``BLOCK`` (set here,
    with ``num_warps``, from the plan). ``inner``, ``row``: see :func:`plan_launch`.
    """
    tensors = [a for a in args if hasattr(a, 'data_ptr')]
    props = _CONTEXT.props or device_props(tensors[0].device)
    top = max_offset(tensors)
    candidates = candidate_configs(family, props)

    def make(config: Config) -> Launch:
        plan = plan_launch(total, config, props, top, inner, _CONTEXT.index_limit, row)
        kwargs = dict(nprog=plan.nprog, iters=plan.iters, **meta, INT64=plan.int64,
                      BLOCK=plan.block, num_warps=plan.num_warps)
        return Launch(kernel, plan.grid, tuple(args), kwargs)

    if _CONTEXT.record is not None:
        _CONTEXT.record.extend(make(c) for c in candidates)
        return
    config = TUNER.pick(tuning_key(kernel, props, total, meta, tensors[0]), candidates,
                        lambda c: run(make(c)))
    run(make(config))


def tuning_key(kernel, props: DeviceProps, total: int, meta: dict, first) -> tuple:
    """What a tuned choice is remembered for: kernel, device, flags, the first tensor's
    dtype, and the work size to a factor of 16 (coarse, so that a model with many
    shapes tunes a few times, not once per shape)."""
    return (getattr(kernel, '__name__', repr(kernel)), props, tuple(sorted(meta.items())),
            first.dtype, total.bit_length() // 4)


def run(item: Launch) -> None:
    """Run a :class:`Launch`."""
    item.kernel[item.grid](*item.args, **item.kwargs)


# ------------------------------------------------------------------------- host tables
def taps(taps, device):
    """Per-axis taps ``(i0, i1, w0, w1)`` as int32 indices and float32 weights."""
    import torch
    i0, i1, w0, w1 = taps
    return (i0.to(device, torch.int32), i1.to(device, torch.int32),
            w0.to(device, torch.float32), w1.to(device, torch.float32))


def output_like(x, out_hw, dtype=None):
    """An empty ``(N, C, *out_hw)`` tensor in ``x``'s layout (channels_last stays): its
    memory order is the flat order :func:`decompose` uses for ``x``."""
    import torch
    fmt = torch.channels_last if channels_last(x) else torch.contiguous_format
    return torch.empty((x.shape[0], x.shape[1]) + tuple(out_hw), dtype=dtype or x.dtype,
                       device=x.device, memory_format=fmt)

"""Procedural segmentation datasets written in the real on-disk layout of each dataset.

No public dataset can be downloaded here, so tests and the demo train on data this module
draws: fundus-like images with vessel trees (DRIVE, STARE, CHASE_DB1, HRF), CT-like
abdominal slices with organ blobs (Synapse) and street-like scenes (Cityscapes). Each
class has its own appearance, so a short training run learns it and clearly beats a
trivial (all-background) predictor.

Layouts and names follow what mmseg's dataset classes and configs read:

==========  ====================================================  =====================
dataset     image / annotation                                    suffixes
==========  ====================================================  =====================
drive       images/{training,validation}/NN.png,                  ``.png``,
            annotations/.../NN_manual1.png                        ``_manual1.png``
stare       images/.../imNNNN.png, annotations/.../imNNNN.ah.png  ``.png``, ``.ah.png``
chase_db1   images/.../Image_NNL.png, .../Image_NNL_1stHO.png     ``.png``, ``_1stHO.png``
hrf         images/.../NN_h.png, annotations/.../NN_h.png         ``.png``, ``.png``
synapse     img_dir/{train,val}/caseNNNN_sliceNNN.jpg,            ``.jpg``, ``.png``
            ann_dir/.../caseNNNN_sliceNNN.png
cityscapes  leftImg8bit/{train,val}/CITY/CITY_NNNNNN_NNNNNN       ``_leftImg8bit.png``,
            _leftImg8bit.png, gtFine/... _gtFine_labelTrainIds    ``_gtFine_labelTrainIds
                                                                  .png``
==========  ====================================================  =====================

Annotations are single-channel PNGs of class indices (vessel datasets: 0/1; Synapse:
0..8; Cityscapes: train ids 0..18 and 255 for "ignore").
"""
from __future__ import annotations

import dataclasses
import math
import os
from typing import Callable, Dict, List, Optional, Tuple

import cv2
import numpy as np


@dataclasses.dataclass(frozen=True)
class Layout:
    """Where one dataset keeps its files."""

    img_dir: str          # with {split}
    ann_dir: str          # with {split}
    splits: Tuple[str, str]  # (train, val) split names
    img_suffix: str
    seg_suffix: str
    default_size: Tuple[int, int]  # (H, W) of generated images
    num_classes: int



DATASETS: Dict[str, Layout] = {
    'drive': Layout('images/{split}', 'annotations/{split}', ('training', 'validation'),
                    '.png', '_manual1.png', (96, 96), 2),
    'stare': Layout('images/{split}', 'annotations/{split}', ('training', 'validation'),
                    '.png', '.ah.png', (160, 160), 2),
    'chase_db1': Layout('images/{split}', 'annotations/{split}', ('training', 'validation'),
                        '.png', '_1stHO.png', (160, 160), 2),
    'hrf': Layout('images/{split}', 'annotations/{split}', ('training', 'validation'),
                  '.png', '.png', (288, 288), 2),
    'synapse': Layout('img_dir/{split}', 'ann_dir/{split}', ('train', 'val'),
                      '.jpg', '.png', (224, 224), 9),
    'cityscapes': Layout('leftImg8bit/{split}', 'gtFine/{split}', ('train', 'val'),
                         '_leftImg8bit.png', '_gtFine_labelTrainIds.png', (256, 512), 19),
}
CITIES = {'train': ('aachen', 'bochum'), 'val': ('frankfurt',)}


def _stem(name: str, index: int, split: str) -> str:
    """File stem (without suffix) of sample ``index``, named like the real dataset."""
    if name == 'drive':
        return f'{index + 1:02d}'
    if name == 'stare':
        return f'im{index + 1:04d}'
    if name == 'chase_db1':
        return f'Image_{index // 2 + 1:02d}{"LR"[index % 2]}'
    if name == 'hrf':
        return f'{index + 1:02d}_{"hdg"[index % 3]}'
    if name == 'synapse':
        return f'case{index // 8 + 1:04d}_slice{index % 8:03d}'
    city = CITIES[split][index % len(CITIES[split])]
    return f'{city}/{city}_{index:06d}_000019'


# ----------------------------------------------------------------------------------
# procedural content
# ----------------------------------------------------------------------------------
def _fundus(rng: np.random.Generator, size: Tuple[int, int]) -> Tuple[np.ndarray, np.ndarray]:
    """A fundus-like RGB image with a branching vessel tree and its 0/1 vessel mask."""
    h, w = size
    yy, xx = np.mgrid[0:h, 0:w].astype(np.float32)
    cy, cx = h / 2 + rng.uniform(-0.05, 0.05) * h, w / 2 + rng.uniform(-0.05, 0.05) * w
    radius = 0.48 * min(h, w)
    dist = np.sqrt((yy - cy) ** 2 + (xx - cx) ** 2) / radius
    fov = dist <= 1.0
    # reddish-orange background, brighter near the optic disc
    disc_y, disc_x = cy + rng.uniform(-0.2, 0.2) * radius, cx + rng.choice([-1, 1]) * 0.45 * radius
    disc = np.exp(-(((yy - disc_y) ** 2 + (xx - disc_x) ** 2) / (2 * (0.12 * radius) ** 2)))
    shade = 1.0 - 0.35 * dist ** 2 + 0.5 * disc
    base = np.array([200, 95, 45], np.float32) * rng.uniform(0.85, 1.1)
    image = shade[..., None] * base[None, None, :]
    # vessel tree: branching smooth random walks from the disc
    mask = np.zeros((h, w), np.uint8)
    scale = min(h, w) / 96.0
    stack = [(disc_x, disc_y, rng.uniform(0, 2 * math.pi), max(1, int(round(2 * scale))), 0)
             for _ in range(int(rng.integers(3, 6)))]
    while stack:
        x, y, angle, width, depth = stack.pop()
        points = [(x, y)]
        for _ in range(int(rng.integers(12, 30))):
            angle += rng.normal(0, 0.25)
            x += math.cos(angle) * 3 * scale
            y += math.sin(angle) * 3 * scale
            points.append((x, y))
            if depth < 3 and rng.random() < 0.08:
                stack.append((x, y, angle + rng.choice([-1, 1]) * rng.uniform(0.4, 1.0),
                              max(1, width - 1), depth + 1))
        pts = np.round(np.array(points)).astype(np.int32).reshape(-1, 1, 2)
        cv2.polylines(mask, [pts], False, 1, thickness=int(width))
    mask &= fov.astype(np.uint8)
    vessel = cv2.GaussianBlur(mask.astype(np.float32), (3, 3), 0.7)
    image *= (1.0 - 0.55 * vessel)[..., None]
    image += rng.normal(0, 6, image.shape)
    image[~fov] = 0
    return np.clip(image, 0, 255).astype(np.uint8)[..., ::-1], mask  # BGR for cv2


# organ label, relative centre (y, x), relative radii (ry, rx), intensity (0-255)
ORGANS = [
    (6, (0.42, 0.30), (0.18, 0.16), 150),   # liver (patient's right = image left)
    (8, (0.45, 0.60), (0.09, 0.12), 110),   # stomach
    (7, (0.40, 0.75), (0.08, 0.06), 140),   # spleen
    (1, (0.52, 0.50), (0.03, 0.03), 230),   # aorta
    (5, (0.55, 0.55), (0.03, 0.09), 125),   # pancreas
    (4, (0.62, 0.34), (0.06, 0.04), 175),   # right kidney
    (3, (0.62, 0.68), (0.06, 0.04), 185),   # left kidney
    (2, (0.52, 0.36), (0.03, 0.025), 80),   # gallbladder
]


def _ct_slice(rng: np.random.Generator, size: Tuple[int, int]) -> Tuple[np.ndarray, np.ndarray]:
    """A CT-like abdominal slice (grey) with organ blobs labelled 1..8."""
    h, w = size
    image = np.full((h, w), 10, np.float32)
    label = np.zeros((h, w), np.uint8)
    cv2.ellipse(image, (w // 2, h // 2), (int(0.42 * w), int(0.32 * h)), 0, 0, 360, 95, -1)
    for organ, (cy, cx), (ry, rx), level in ORGANS:
        if rng.random() < 0.15:  # organs are not on every slice
            continue
        centre = (int((cx + rng.uniform(-0.03, 0.03)) * w), int((cy + rng.uniform(-0.03, 0.03)) * h))
        axes = (max(2, int(rx * w * rng.uniform(0.8, 1.2))), max(2, int(ry * h * rng.uniform(0.8, 1.2))))
        angle = rng.uniform(0, 180)
        cv2.ellipse(image, centre, axes, angle, 0, 360, float(level), -1)
        cv2.ellipse(label, centre, axes, angle, 0, 360, organ, -1)
    image = cv2.GaussianBlur(image, (5, 5), 1.0) + rng.normal(0, 5, (h, w))
    grey = np.clip(image, 0, 255).astype(np.uint8)
    return np.repeat(grey[..., None], 3, axis=2), label


# train id -> BGR colour of the street-like classes drawn
STREET = {'road': (0, (128, 64, 128)), 'sidewalk': (1, (232, 35, 244)),
          'building': (2, (70, 70, 70)), 'vegetation': (8, (35, 142, 107)),
          'sky': (10, (180, 130, 70)), 'person': (11, (60, 20, 220)),
          'car': (13, (142, 0, 0))}


def _street(rng: np.random.Generator, size: Tuple[int, int]) -> Tuple[np.ndarray, np.ndarray]:
    """A street-like scene: sky, buildings, vegetation, sidewalk, road, cars, people."""
    h, w = size
    image = np.zeros((h, w, 3), np.float32)
    label = np.full((h, w), 255, np.uint8)

    def fill(region, cls):
        tid, colour = STREET[cls]
        image[region] = colour
        label[region] = tid

    horizon = int(h * rng.uniform(0.35, 0.5))
    fill((slice(0, horizon), slice(None)), 'sky')
    x = 0
    while x < w:  # skyline of buildings and trees
        bw = int(rng.integers(w // 10, w // 4))
        top = int(rng.integers(h // 10, horizon))
        fill((slice(top, horizon + h // 10), slice(x, x + bw)),
             'building' if rng.random() < 0.7 else 'vegetation')
        x += bw
    road_top = horizon + h // 10
    fill((slice(road_top, h), slice(None)), 'sidewalk')
    poly = np.array([[int(w * 0.45), road_top], [int(w * 0.55), road_top], [w, h], [0, h]],
                    np.int32)
    road = np.zeros((h, w), np.uint8)
    cv2.fillPoly(road, [poly], 1)
    fill(road.astype(bool), 'road')
    for _ in range(int(rng.integers(1, 4))):  # cars on the road
        cy = int(rng.integers(road_top + h // 20, h - h // 10))
        cw = int(w * 0.08 * (1 + (cy - road_top) / h * 3))
        cx = int(rng.integers(0, max(1, w - cw)))
        fill((slice(cy - cw // 2, cy), slice(cx, cx + cw)), 'car')
    for _ in range(int(rng.integers(0, 3))):  # people on the sidewalk
        px = int(rng.integers(0, w - 4))
        ph = int(h * 0.12)
        fill((slice(road_top - ph // 2, road_top + ph // 2), slice(px, px + max(2, ph // 4))),
             'person')
    label[:, :2] = 255  # a thin ignored border, as in real annotations
    image += rng.normal(0, 8, image.shape)
    return np.clip(image, 0, 255).astype(np.uint8), label


GENERATORS = {'drive': _fundus, 'stare': _fundus, 'chase_db1': _fundus, 'hrf': _fundus,
              'synapse': _ct_slice, 'cityscapes': _street}


def make_dataset(name: str, out_dir: str, num_train: int = 8, num_val: int = 4,
                 seed: int = 0, size: Optional[Tuple[int, int]] = None) -> Dict[str, List[str]]:
    """Write a synthetic ``name`` dataset under ``out_dir``; returns the written image paths.

    Args:
        name: one of :data:`DATASETS`.
        out_dir: the dataset root (what a config's ``data_root`` points at).
        num_train, num_val: samples per split (>= 1).
        seed: random seed; the same seed writes the same files.
        size: image ``(H, W)``; default per dataset (small, for CPU training).
    """
    if name not in DATASETS:
        raise ValueError(f'name must be one of {sorted(DATASETS)}, got {name!r}')
    for arg, value in (('num_train', num_train), ('num_val', num_val)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f'{arg} must be an int >= 1, got {value!r}')
    layout = DATASETS[name]
    size = tuple(size) if size is not None else layout.default_size
    if len(size) != 2 or min(size) < 16:
        raise ValueError(f'size must be (H, W) with both >= 16, got {size!r}')
    rng = np.random.default_rng(seed)
    written: Dict[str, List[str]] = {}
    for split, count in zip(layout.splits, (num_train, num_val)):
        written[split] = []
        offset = 0 if split == layout.splits[0] else num_train
        for i in range(count):
            stem = _stem(name, offset + i, split)
            image, label = GENERATORS[name](rng, size)
            img_path = os.path.join(out_dir, layout.img_dir.format(split=split),
                                    stem + layout.img_suffix)
            ann_path = os.path.join(out_dir, layout.ann_dir.format(split=split),
                                    stem + layout.seg_suffix)
            for path in (img_path, ann_path):
                os.makedirs(os.path.dirname(path), exist_ok=True)
            cv2.imwrite(img_path, image)
            cv2.imwrite(ann_path, label)
            written[split].append(img_path)
    return written

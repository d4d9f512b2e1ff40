_base_ = [
    'mmseg::deeplabv3plus/deeplabv3plus_r50-d8_4xb2-40k_cityscapes-512x1024.py',
    '../_base_/cann_runtime.py',
]

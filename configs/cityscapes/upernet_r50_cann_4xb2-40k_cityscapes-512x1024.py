_base_ = [
    'mmseg::upernet/upernet_r50_4xb2-40k_cityscapes-512x1024.py',
    '../_base_/cann_runtime.py',
]

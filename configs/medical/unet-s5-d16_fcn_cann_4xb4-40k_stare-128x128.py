_base_ = [
    'mmseg::unet/unet-s5-d16_fcn_4xb4-40k_stare-128x128.py',
    '../_base_/cann_runtime.py',
]

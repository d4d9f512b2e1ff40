_base_ = [
    'mmseg::unet/unet-s5-d16_fcn_4xb4-40k_hrf-256x256.py',
    '../_base_/cann_runtime.py',
]

# Mixed precision: AmpOptimWrapper with a dynamic loss scale (needs a GPU or an NPU),
# max pooling computed in fp16 (exact), averages in fp32 (see the README's precision
# section).
_base_ = ['./unet-s5-d16_fcn_cann_4xb4-40k_chase-db1-128x128.py']
optim_wrapper = dict(type='AmpOptimWrapper', loss_scale='dynamic')
custom_hooks = [
    dict(type='CANNOpsHook', pool_precision=dict(max='fp16', avg='fp32'),
         upsample_precision='input')
]

# The end-to-end demo (`make demo`): UNet-S5-D16 + FCN with CANN ops on synthetic
# DRIVE-like data (tools/make_synthetic_data.py drive), sized for a 2-core CPU: the same
# architecture at a quarter of the width (16 base channels instead of 64), 96x96 fundus
# images, 64x64 crops, 300 iterations of batch 4, whole-image inference.
_base_ = ['./unet-s5-d16_fcn_cann_4xb4-40k_drive-64x64.py']
data_root = 'data/synthetic_drive'
img_scale = (96, 96)
crop_size = (64, 64)
train_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='LoadAnnotations'),
    dict(type='RandomResize', scale=img_scale, ratio_range=(0.8, 1.25), keep_ratio=True),
    dict(type='RandomCrop', crop_size=crop_size, cat_max_ratio=0.75),
    dict(type='RandomFlip', prob=0.5),
    dict(type='PhotoMetricDistortion'),
    dict(type='PackSegInputs')
]
test_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='Resize', scale=img_scale, keep_ratio=True),
    dict(type='LoadAnnotations'),
    dict(type='PackSegInputs')
]
train_dataloader = dict(
    batch_size=4, num_workers=0, persistent_workers=False,
    dataset=dict(times=100, dataset=dict(data_root=data_root, pipeline=train_pipeline)))
val_dataloader = dict(
    num_workers=0, persistent_workers=False,
    dataset=dict(data_root=data_root, pipeline=test_pipeline))
test_dataloader = val_dataloader
model = dict(
    backbone=dict(base_channels=16),
    decode_head=dict(in_channels=16, channels=16),
    auxiliary_head=dict(in_channels=32, channels=16),
    # UNet-S5-D16 needs sides divisible by 16: training crops and test images are padded
    # to a multiple of 16 (bottom/right; the padding is cropped off the predictions), so
    # whole-image inference takes any image size (the fundus images are 96x96)
    data_preprocessor=dict(size=None, size_divisor=16, test_cfg=dict(size_divisor=16)),
    test_cfg=dict(mode='whole'))
val_evaluator = dict(type='IoUMetric', iou_metrics=['mIoU', 'mDice'])
test_evaluator = val_evaluator
train_cfg = dict(type='IterBasedTrainLoop', max_iters=300, val_interval=300)
optim_wrapper = dict(optimizer=dict(lr=0.05))
param_scheduler = [dict(type='PolyLR', eta_min=1e-4, power=0.9, begin=0, end=300,
                        by_epoch=False)]
default_hooks = dict(logger=dict(interval=25), checkpoint=dict(interval=300))

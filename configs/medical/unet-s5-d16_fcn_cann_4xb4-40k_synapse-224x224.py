# UNet-S5-D16 + FCN on Synapse multi-organ CT (background + 8 organs), 224x224 slices.
# mmseg ships the Synapse dataset settings but no model config for it; this one pairs
# the dataset with mmseg's UNet model and 40k schedule.
_base_ = [
    'mmseg::_base_/models/fcn_unet_s5-d16.py',
    'mmseg::_base_/datasets/synapse.py',
    'mmseg::_base_/default_runtime.py',
    'mmseg::_base_/schedules/schedule_40k.py',
    '../_base_/cann_runtime.py',
]
crop_size = (224, 224)
data_preprocessor = dict(size=crop_size)
model = dict(
    data_preprocessor=data_preprocessor,
    decode_head=dict(num_classes=9),
    auxiliary_head=dict(num_classes=9),
    test_cfg=dict(mode='whole'))
train_dataloader = dict(batch_size=4)
val_evaluator = dict(type='IoUMetric', iou_metrics=['mIoU', 'mDice'])
test_evaluator = val_evaluator

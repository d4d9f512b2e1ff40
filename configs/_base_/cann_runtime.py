# CANN runtime settings shared by every mmseg-cann config: import the package (registers
# the CANN modules and CANNOpsHook), convert the model before train/val/test and route
# mmseg's resize() through mmseg_cann. Precision: the package defaults
# (max='input', avg='fp32', upsample='input').
custom_imports = dict(imports=['mmseg_cann'], allow_failed_imports=False)
custom_hooks = [dict(type='CANNOpsHook')]

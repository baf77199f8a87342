"""Training the face CNN (`tracker train`): data and crops, augmentation, the distillation target,
the trainable net and its export to a caffemodel. Needs PyTorch (the `train` extra); the guard
never imports this package."""

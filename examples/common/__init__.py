"""Building blocks shared by the example training scripts (model, data, schedule,
checkpoints, distributed backends). They import torch; ``hpcdl`` itself does not."""

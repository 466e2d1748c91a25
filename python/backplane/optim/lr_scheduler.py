"""Learning-rate schedulers with torch.optim.lr_scheduler's names and formulas (the C++ Note
[Schedulers]): StepLR, LinearLR, CosineAnnealingLR, LambdaLR, OneCycleLR, and Hugging Face's
get_cosine_schedule_with_warmup. Call scheduler.step() after optimizer.step()."""
from .._core import (CosineAnnealingLR, LambdaLR, LinearLR, LRScheduler, OneCycleLR, StepLR,
                     get_cosine_schedule_with_warmup)

__all__ = ["LRScheduler", "StepLR", "LinearLR", "CosineAnnealingLR", "LambdaLR", "OneCycleLR",
           "get_cosine_schedule_with_warmup"]

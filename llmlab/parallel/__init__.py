"""Parallelism over `torch.distributed`: tensor parallelism (`tp`), pipeline parallelism (`pp`),
the process launcher (`launch`) and a communication-vs-compute cost model (`cost`)."""

"""Version 3: V2 plus hand-written Triton kernels (RMSNorm, flash attention), forward and backward."""

"""The job and operator images: the image lock (`lock`: which image each PyTorch-CUDA line runs, pinned by digest)
and building and pushing them (`build`). The command line is `sweep images` (kubesweep/cli/images.py)."""

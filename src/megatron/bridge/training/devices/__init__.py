"""What differs between GPUs and CPU smoke mode: the platform, compatibility layers, optimizer kernels, CUDA
graphs and their capture memory."""

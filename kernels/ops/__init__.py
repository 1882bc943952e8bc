"""Triton kernels and their torch.autograd.Functions (math in each module's docstring).

Importing this package decorates the kernels: set TRITON_INTERPRET=1 before that to run them on
CPU. Use them through the dispatcher in `kernels`, which also offers the torch references.
"""

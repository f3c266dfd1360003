"""Plugging vramkit in: the pieces that make a framework allocate GPU memory through vramkit.

Users import one of them once, at the start of a program, and the framework's allocations
come from vramkit's pools from then on: ``vramkit.torch`` (PyTorch's allocator, with
``torch_settings`` for PyTorch's settings string and ``_torch_build`` for the C++ backend
it compiles against the installed PyTorch), ``vramkit.cupy``, ``vramkit.numba``, and
``vramkit.integrations`` (memory logging callbacks for the Hugging Face and Lightning
trainers). Each imports its framework only when imported itself, so this package is empty.
PyTorch's native parts are here too: torch_hooks.c (built with the package), and
torch_oom.cpp and torch_backend.cpp with its torch_backend_*.hpp, which the wheel carries
as sources because they are compiled against the PyTorch installed beside vramkit.
"""

"""scratchlm's own C++ decode kernels (compiled on first use, cached) and their Python wrappers.

build.py compiles csrc/*.cpp for this machine; ops.py is what the rest of the package calls. Every
kernel has a pure-torch path computing the same function (used when SCRATCHLM_KERNELS=0 or no
compiler is present), and tests/kernels/ check the two against each other and against gguf-py.
"""

"""The GGUF tables: target architectures (``arch``, ``llama_archs``), MoA names (``names``), a
drafter's shape (``drafter_spec``) and why a file is not a whole GGUF (``check``).

No native import here: ``moa-cpp convert`` and the converter's checks run without the native
library.
"""

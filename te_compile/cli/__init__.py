"""The command line's pieces (``python -m te_compile`` / ``te-compile``, te_compile/__main__.py dispatches): its
argument parsing helpers (``cli_parser``), the demo (``demo``) and the attention benchmark (``benchmark``).
"""

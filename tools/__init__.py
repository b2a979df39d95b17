"""Development tools that are not part of the installed package: the differential fuzzer (``python -m tools.fuzz``),
the peer score_mods / mask_mods it draws from, the multi-process distributed harness (``torchrun -m
tools.distributed``) and the fuzzer-run comparison (``python tools/fuzz_identity.py``). Run them from the
checkout's root."""

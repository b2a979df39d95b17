"""The user API beyond the backend: ``explain`` (what each attention site runs on, and why), ``tune`` (measure a
model's sites on this GPU) and the whole-model check (``model_check``). ``te_compile`` re-exports the functions."""

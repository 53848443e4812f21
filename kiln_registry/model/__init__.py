"""Reading model directories: shards, tokenizer, adapter and whole-model inspection.

Submodules read files through ``kiln_registry.identity.hashing`` and never
import torch; Transformers is imported lazily by ``model.tokenizer`` only.
Nothing is imported or executed here.
"""

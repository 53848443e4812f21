"""The reference teacher: eager Transformers on CPU speaking vLLM's prompt-logprobs protocol.

``protocol`` (request rules, bodies), ``model`` (loading and numbers),
``identity`` (its TeacherIdentityV1 and ``load_reference_teacher``) and
``app`` (FastAPI app and uvicorn runner).  Importing this package imports
none of them, so torch is loaded only by those who ask for it.
"""

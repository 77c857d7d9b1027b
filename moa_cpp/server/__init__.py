"""``moa-cpp serve``: an OpenAI-compatible HTTP server with MoA speculative decoding.

Laid out like ``llama_cpp/server``: :mod:`.settings` (flags and limits), :mod:`.auth` (API keys,
bind policy), :mod:`.errors` (OpenAI's error shape), :mod:`.schemas` (request validation),
:mod:`.sessions` (pre-allocated generation sessions, FIFO queue), :mod:`.worker` (a generation
run off the event loop), :mod:`.app` (the Starlette routes). Needs the ``server`` extra
(starlette, uvicorn, sse-starlette); ``import moa_cpp`` never imports it.
"""

"""`dayzero serve`: a generation artifact behind an OpenAI-compatible HTTP API.

One concept per module: `limits` bounds a request body (16 MiB, 30 s), `workers` reads requests
off the event loop, `protocol` checks a body (with `bounds`: its strings, its nesting, a
prompt's length before tokenizing; `chat`: messages through the chat template; `errors`:
OpenAI's error shape), `engine` owns the scheduler on a background thread, `metrics` keeps the
Prometheus registry, `app` holds the FastAPI routes, and `server` runs uvicorn and drains on
SIGTERM. fastapi, uvicorn and prometheus_client (the `serve` extra) are imported only by those
modules, so the rest of the runtime runs without them.
"""

"""`dayzero serve`: a generation artifact behind an OpenAI-compatible HTTP API.

One concept per module: `protocol` reads and checks request bodies, `engine` owns the scheduler
on a background thread, `metrics` keeps the Prometheus registry, `app` holds the FastAPI routes,
and `server` runs uvicorn and drains on SIGTERM. fastapi, uvicorn and prometheus_client (the
`serve` extra) are imported only by those modules, so the rest of the runtime runs without them.
"""

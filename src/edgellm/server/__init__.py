"""`edgellm serve`: an OpenAI-compatible HTTP server over one model (install `edgellm[server]`).

    app.py        the ASGI application (Starlette): routes behind the API key, errors as OpenAI's JSON
    routes.py     the endpoints
    schemas.py    request bodies checked field by field (400 naming the field)
    responses.py  response bodies and streamed chunks
    bridge.py     engine thread -> event loop
    metrics.py    /metrics (prometheus_client)
    runner.py     uvicorn, the ready message, draining on SIGTERM / Ctrl-C
"""
